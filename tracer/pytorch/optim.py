"""The optimizer steps the tracer records, restated from ``torch.optim`` op for op.

The real ``torch.optim`` optimizers cannot be traced (they read the step count with
``.item()``; ``capturable=True`` wants CUDA), so :func:`adamw_foreach` and
:func:`sgd_foreach` restate their non-capturable multi-tensor paths op for op (the
CPU-side step counters launch no GPU kernel and are left out); :func:`adamw_master` and
:func:`sgd_master` are the per-parameter fp32 steps of mixed-precision training.
"""
from __future__ import annotations

OPTIMIZERS = ("adamw", "sgd")
# torch.optim defaults (AdamW) and a common SGD setting; the values change no shape.
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 1e-2}
SGD = {"lr": 1e-2, "momentum": 0.9, "dampening": 0.0}
_STEP = 1  # the optimizer step whose bias corrections are used (a Python number)
# fp16 mixed precision: the static loss scale (torch.amp.GradScaler's initial scale); the
# backward starts from loss x LOSS_SCALE and each parameter's step unscales its gradient.
LOSS_SCALE = 2.0 ** 16


def adamw_foreach(params, grads, exp_avgs, exp_avg_sqs, *, lr=ADAMW["lr"], beta1=ADAMW["beta1"],
                  beta2=ADAMW["beta2"], eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
                  step=_STEP):
    """One AdamW step with the ``_foreach_*`` kernels of ``torch.optim.AdamW(foreach=True)``
    (non-capturable, no amsgrad), in its order. ``grads`` is a list that is emptied once
    the last kernel reading it has run, as torch.optim's ``del device_grads`` frees it."""
    import torch
    torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    grads.clear()
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = [-(lr / bias_correction1)] * len(params)
    exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(exp_avg_sq_sqrt, [bias_correction2 ** 0.5] * len(params))
    torch._foreach_add_(exp_avg_sq_sqrt, eps)
    torch._foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt, step_size)


def sgd_foreach(params, grads, momentum_buffers, *, lr=SGD["lr"], momentum=SGD["momentum"],
                dampening=SGD["dampening"]):
    """One SGD-with-momentum step as ``torch.optim.SGD(momentum=..., foreach=True)`` runs
    it once the momentum buffers exist (no weight decay, no Nesterov)."""
    import torch
    torch._foreach_mul_(momentum_buffers, momentum)
    torch._foreach_add_(momentum_buffers, grads, alpha=1 - dampening)
    grads.clear()
    torch._foreach_add_(params, momentum_buffers, alpha=-lr)


def adamw_master(grad, master, exp_avg, exp_avg_sq, *, lr=ADAMW["lr"], beta1=ADAMW["beta1"],
                 beta2=ADAMW["beta2"], eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
                 step=_STEP, inv_scale=1.0):
    """Part a of a mixed-precision AdamW step: one parameter's fp32 ``master`` and moments
    from its low-precision gradient, with the single-tensor kernels of
    ``torch.optim.AdamW(foreach=False)`` (in place where they can be), on the gradient
    cast to fp32 (and unscaled in place when ``inv_scale`` is not 1: fp16 loss scaling).
    Its temporaries, the fp32 gradient and then the denominator, are freed as soon as
    they are last used."""
    g = grad.float()
    if inv_scale != 1.0:
        g.mul_(inv_scale)
    master.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    del g
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    denom = exp_avg_sq.sqrt().div_(bias_correction2 ** 0.5).add_(eps)
    master.addcdiv_(exp_avg, denom, value=-(lr / bias_correction1))


def sgd_master(grad, master, momentum_buffer, *, lr=SGD["lr"], momentum=SGD["momentum"],
               dampening=SGD["dampening"], inv_scale=1.0):
    """Part a of a mixed-precision SGD-with-momentum step: one parameter's fp32 ``master``
    and momentum from its low-precision gradient (its one temporary: the fp32 gradient,
    unscaled in place when ``inv_scale`` is not 1)."""
    g = grad.float()
    if inv_scale != 1.0:
        g.mul_(inv_scale)
    momentum_buffer.mul_(momentum).add_(g, alpha=1 - dampening)
    del g
    master.add_(momentum_buffer, alpha=-lr)


def state_names(optimizer: str, amp: str | None = None) -> tuple[str, ...]:
    """The per-parameter optimizer state tensors, in the order the step takes them
    (under ``amp``, the fp32 master copy first)."""
    names = ("exp_avg", "exp_avg_sq") if optimizer == "adamw" else ("momentum_buffer",)
    return ("master",) + names if amp else names
