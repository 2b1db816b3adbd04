"""Synthetic training iterations: realistic profiles of three model families, without torch.

``synthesize(model, ...)`` (or ``mlp``, ``cnn``, ``transformer``) builds one training
iteration of a model as a :class:`~simulator.profile.Profile`: the forward pass, the
backward pass in reverse, then one Adam step per weight. Kernel times come from the
roofline model of a hardware preset (:func:`tracer.roofline.kernel_time_us`), so the
profiles are reproducible, byte for byte, on any machine.

What is modelled
----------------
- Tensors are storages. Kinds: weights and biases ``weight``; Adam's ``exp_avg`` and
  ``exp_avg_sq`` (two per weight, same size) ``optimizer_state``; the batch (data and
  labels) ``input``; forward outputs ``activation``; everything made in backward
  ``gradient``. Weights, optimizer state and the batch are persistent.
- Every forward op saves what the real backward kernel reads: a linear or convolution
  its input (and weight), ReLU its output, GELU its input, layer norm its input plus
  per-row mean and rstd (fp32), batch norm its input plus per-channel mean and invstd
  (fp32), attention one ``qkv`` tensor, its output and the logsumexp (B x heads x S
  fp32), average pooling its input, cross-entropy the logits and labels.
- A backward op reads the gradients of its forward op's outputs plus the saved tensors
  and writes the gradients of its activation inputs and of its weights. The batch gets
  no gradient (so the first layer's backward computes only weight gradients).
- Gradient accumulation: when a tensor feeds several forward ops (residual and skip
  connections, the tied embedding), the first backward contribution creates its
  gradient; each later one writes a temporary (``<name>.grad.partialK``) that an
  ``aten::add_`` op adds in place (the gradient in ``updates``, the temporary in
  ``inputs``).
- A residual ``add`` launches no backward kernel (autograd passes the incoming gradient
  on unchanged), so its inputs share the gradient tensor of its output until a later
  contribution is added into it in place.
- The loss is a fused cross-entropy whose backward reads the loss (the seed of the
  backward pass), the logits and the labels and writes the gradient of the logits.
- Weight gradients live until their Adam op (``aten::_fused_adam_``: reads the
  gradient, updates the weight and its two moments, 12 flops per element), which runs
  in parameter order after the whole backward pass, as ``optimizer.step()`` does.
- Op times: ``kernel_time_us(hardware, flops, bytes_moved, dtype)`` where
  ``bytes_moved`` is the bytes of the op's inputs, outputs and updates.
- Convolutions get a cuDNN-like workspace of ``min(input bytes, 256 MiB)`` in forward
  and backward; attention's backward a workspace for its fp32 dQ accumulator
  (B x S x width x 4 bytes), as FlashAttention-2 allocates.

Models
------
- ``mlp``: ``layers`` blocks of Linear(width, width) + ReLU on ``width`` input
  features, then Linear(width, 1000) and cross-entropy. ``seq`` is ignored.
- ``cnn``: a ResNet-style network (CIFAR-like 3x3 stem): conv3x3(3 -> width) + batch
  norm + ReLU, then ``layers`` basic blocks (conv3x3-bn-relu-conv3x3-bn, plus the skip,
  ReLU) in 3 stages of near-equal size (earlier stages get the remainder); the first
  block of stages 2 and 3 halves the spatial size with a stride-2 conv, doubles the
  channels and has a 1x1 stride-2 projection conv + batch norm on its skip; then global
  average pooling and Linear(channels, 1000). ``seq`` is the image side in pixels.
  Convolution flops 2 x B x Hout x Wout x Cin x Cout x k x k; backward twice that (once
  for the stem, which needs no input gradient).
- ``transformer``: GPT-2-like: token ids (int64, B x S x 8 bytes) -> token + position
  embedding (one fused op; the position table has S rows), ``layers`` pre-norm blocks (layernorm, qkv linear, attention with
  width / 64 heads, output projection, residual add, layernorm, fc1 (4 x width), GELU,
  fc2, residual add), final layernorm, language-model head over a 50257-token
  vocabulary whose weight is the token embedding (tied, as in GPT-2), cross-entropy.
  Attention forward flops 4 x B x S x S x width, backward 2.5 x that. ``seq`` is the
  sequence length.

Simplifications
---------------
- One op per forward kernel and one per backward function (a linear's backward is one
  op for its two matmuls and its bias reduction); no dropout; ReLU is not in place.
- Every tensor (weights and optimizer state included) has the one ``dtype``: pure
  fp16/bf16 training, no fp32 master weights; only norm statistics and logsumexp are
  fp32, token ids and labels int64.
- Batch-norm running statistics (a few KB) are left out; so are the position ids,
  the backward seed (a scalar ``ones``) and the allocator's rounding.
- Attention flops are counted as for full (non-causal) attention, as the usual
  ``12 x L x B x S^2 x width`` training estimate does; element-wise ops cost a few
  flops per element (their time is memory-bound anyway), backward twice forward.
- The attention kernel is named as PyTorch's fused SDPA for the dtype (flash for
  fp16/bf16, memory-efficient for fp32); both save the same tensors.

Ids are ``t0, t1, ...`` for tensors and ``o0, o1, ...`` for ops, in creation order;
names and ``module`` strings say what each one is (``layer3.fc1.weight``,
``layer3.gelu.out``, module ``layer3.fc1``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.errors import InputError
from simulator.hardware import Hardware, load_hardware
from simulator.profile import Op, Profile, Tensor
from simulator.units import MAX_COUNT
from tracer.roofline import DTYPE_BYTES, kernel_time_us, peak_tflops

MODELS = ("mlp", "cnn", "transformer")
DEFAULT_HARDWARE = "a100-40gb-pcie4"
DEFAULTS = {
    "mlp": {"layers": 8, "width": 4096, "batch": 256, "seq": None},
    "cnn": {"layers": 8, "width": 64, "batch": 64, "seq": 112},
    "transformer": {"layers": 12, "width": 768, "batch": 8, "seq": 512},
}
# Tensors each block adds, at least (the cnn's first blocks add more): R23's limit on
# the count is checked before a profile is built.
_TENSORS_PER_LAYER = {"mlp": 12, "cnn": 41, "transformer": 71}
CLASSES = 1000
VOCAB = 50257
HEAD_DIM = 64
CNN_STAGES = 3
CONV_WORKSPACE_CAP = 256 * 2**20
ADAM_FLOPS_PER_ELEMENT = 12
INDEX_DTYPE = "int64"
STATS_DTYPE = "fp32"
ELEMENT_BYTES = {**DTYPE_BYTES, INDEX_DTYPE: 8}

# Flops per element of the element-wise forward kernels; backward costs twice as much.
_ELEMENTWISE_FLOPS = {"relu": 1, "add": 1, "gelu": 8, "norm": 8, "pool": 1, "softmax": 5}


# ----------------------------------------------------------------------------- builder


@dataclass(frozen=True)
class _Node:
    """What one forward op leaves for the backward pass."""
    module: str
    backward_name: str
    outputs: tuple[str, ...]      # differentiable outputs: their gradients are read
    saved: tuple[str, ...]        # tensors the backward kernel reads besides the gradients
    grad_inputs: tuple[str, ...]  # activation inputs that receive a gradient
    weights: tuple[str, ...]      # weights that receive a gradient
    flops: float = 0.0
    workspace: int = 0
    seed: bool = False            # the loss: backward starts here with no incoming gradient
    passthrough: bool = False     # a residual add: no kernel, the gradient passes on as is


class _Graph:
    """Allocates tensor and op ids, times ops, records the tape and replays it backward."""

    def __init__(self, hardware: Hardware, dtype: str):
        self.hardware = hardware
        self.dtype = dtype
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []
        self._by_id: dict[str, Tensor] = {}
        self._tape: list[_Node] = []
        self._grad: dict[str, str] = {}
        self._partials: dict[str, int] = {}
        self._weights: list[str] = []
        self._weight_module: dict[str, str] = {}

    # -- tensors

    def tensor(self, name: str, shape: tuple[int, ...], kind: str, dtype: str | None = None) -> str:
        """A new tensor; its bytes follow from shape and dtype (the model's by default)."""
        dtype = dtype or self.dtype
        tid = f"t{len(self.tensors)}"
        tensor = Tensor(id=tid, bytes=math.prod(shape) * ELEMENT_BYTES[dtype], kind=kind,
                        name=name, shape=tuple(shape), dtype=dtype)
        self.tensors.append(tensor)
        self._by_id[tid] = tensor
        return tid

    def weight(self, module: str, role: str, shape: tuple[int, ...]) -> str:
        """A trainable parameter ``<module>.<role>``; it gets one Adam op."""
        tid = self.tensor(f"{module}.{role}", shape, "weight")
        self._weights.append(tid)
        self._weight_module[tid] = module
        return tid

    def activation(self, module: str, role: str, shape: tuple[int, ...],
                   dtype: str | None = None) -> str:
        return self.tensor(f"{module}.{role}", shape, "activation", dtype)

    def shape(self, tid: str) -> tuple[int, ...]:
        return self._by_id[tid].shape

    def numel(self, tid: str) -> int:
        return math.prod(self._by_id[tid].shape)

    def nbytes(self, tid: str) -> int:
        return self._by_id[tid].bytes

    def needs_grad(self, tid: str) -> bool:
        """Only activations receive gradients (the batch does not; weights are separate)."""
        return self._by_id[tid].kind == "activation"

    # -- ops

    def op(self, name: str, phase: str, module: str, inputs=(), outputs=(), updates=(),
           flops: float = 0.0, workspace: int = 0) -> str:
        """Append an op timed by the roofline over the bytes of all its tensors."""
        inputs, outputs, updates = _unique(inputs), _unique(outputs), _unique(updates)
        moved = sum(self.nbytes(t) for t in inputs + outputs + updates)
        oid = f"o{len(self.ops)}"
        self.ops.append(Op(id=oid, name=name, phase=phase,
                           time_us=kernel_time_us(self.hardware, flops, moved, self.dtype),
                           inputs=inputs, outputs=outputs, updates=updates,
                           workspace_bytes=int(workspace), flops=float(flops), module=module))
        return oid

    def forward(self, name: str, module: str, inputs, outputs, node: _Node | None,
                flops: float, workspace: int = 0) -> None:
        """A forward op, and the tape entry its backward will replay (None: no backward)."""
        self.op(name, "forward", module, inputs, outputs, flops=flops, workspace=workspace)
        if node is not None:
            self._tape.append(node)

    # -- backward and optimizer

    def backward(self) -> None:
        """Replay the tape in reverse: one backward op per node, plus accumulations."""
        for node in reversed(self._tape):
            if node.passthrough:
                self._pass_through(node)
                continue
            incoming = [self._grad[t] for t in node.outputs if t in self._grad]
            if not incoming and not node.seed:
                continue
            made, pending = [], []
            for target in node.grad_inputs + node.weights:
                if target in self._grad:
                    partial = self._partial(target)
                    made.append(partial)
                    pending.append((target, partial))
                else:
                    self._grad[target] = self._gradient(target, "grad")
                    made.append(self._grad[target])
            self.op(node.backward_name, "backward", node.module, incoming + list(node.saved),
                    made, flops=node.flops, workspace=node.workspace)
            for target, partial in pending:
                self._accumulate(node.module, target, partial)

    def _pass_through(self, node: _Node) -> None:
        incoming = self._grad.get(node.outputs[0])
        if incoming is None:
            return
        for target in node.grad_inputs:
            if target in self._grad:
                self._accumulate(node.module, target, incoming)
            else:
                self._grad[target] = incoming

    def _accumulate(self, module: str, target: str, contribution: str) -> None:
        """``grad(target) += contribution`` in place."""
        self.op("aten::add_", "backward", module, [contribution], updates=[self._grad[target]],
                flops=self.numel(contribution))

    def _gradient(self, target: str, suffix: str) -> str:
        source = self._by_id[target]
        return self.tensor(f"{source.name}.{suffix}", source.shape, "gradient", source.dtype)

    def _partial(self, target: str) -> str:
        count = self._partials.get(target, 0) + 1
        self._partials[target] = count
        return self._gradient(target, f"grad.partial{count}")

    def optimizer(self) -> None:
        """One fused Adam op per weight, in parameter order; creates the Adam state."""
        for weight in self._weights:
            tensor = self._by_id[weight]
            exp_avg = self.tensor(f"{tensor.name}.exp_avg", tensor.shape, "optimizer_state")
            exp_avg_sq = self.tensor(f"{tensor.name}.exp_avg_sq", tensor.shape, "optimizer_state")
            self.op("aten::_fused_adam_", "optimizer", self._weight_module[weight],
                    [self._grad[weight]], updates=[weight, exp_avg, exp_avg_sq],
                    flops=ADAM_FLOPS_PER_ELEMENT * self.numel(weight))

    def profile(self, name: str, source: dict) -> Profile:
        """Run backward and optimizer, then build (and so validate) the profile."""
        self.backward()
        self.optimizer()
        return Profile(name=name, tensors=tuple(self.tensors), ops=tuple(self.ops),
                       source=source, origin=name)


def _unique(ids) -> tuple[str, ...]:
    return tuple(dict.fromkeys(ids))


# ----------------------------------------------------------------------------- layers


def _linear(g: _Graph, module: str, x: str, features: int, *, bias: bool = True,
            weight: str | None = None) -> str:
    """y = x W^T + b over the last dimension; ``weight`` reuses (ties) an existing one."""
    *lead, k = g.shape(x)
    rows = math.prod(lead)
    w = weight or g.weight(module, "weight", (features, k))
    b = g.weight(module, "bias", (features,)) if bias else None
    params = (w,) + ((b,) if b else ())
    y = g.activation(module, "out", (*lead, features))
    matmul = 2.0 * rows * k * features
    grad_x = g.needs_grad(x)
    node = _Node(module, "aten::linear_backward", (y,), (x, w),
                 (x,) if grad_x else (), params,
                 flops=matmul * (1 + grad_x) + (rows * features if bias else 0))
    g.forward("aten::addmm" if bias else "aten::mm", module, (x,) + params, (y,), node,
              flops=matmul + (rows * features if bias else 0))
    return y


def _conv(g: _Graph, module: str, x: str, channels: int, kernel: int, stride: int) -> str:
    """A bias-free kernel x kernel convolution with 'same' padding and the given stride."""
    batch, cin, height, width = g.shape(x)
    hout, wout = (height - 1) // stride + 1, (width - 1) // stride + 1
    w = g.weight(module, "weight", (channels, cin, kernel, kernel))
    y = g.activation(module, "out", (batch, channels, hout, wout))
    flops = 2.0 * batch * hout * wout * cin * channels * kernel * kernel
    workspace = min(g.nbytes(x), CONV_WORKSPACE_CAP)
    grad_x = g.needs_grad(x)
    node = _Node(module, "aten::convolution_backward", (y,), (x, w),
                 (x,) if grad_x else (), (w,), flops=flops * (1 + grad_x), workspace=workspace)
    g.forward("aten::cudnn_convolution", module, (x, w), (y,), node, flops, workspace)
    return y


def _batch_norm(g: _Graph, module: str, x: str) -> str:
    """Training-mode batch norm over (N, H, W) per channel; saves x, mean and invstd."""
    channels = g.shape(x)[1]
    gamma, beta = g.weight(module, "weight", (channels,)), g.weight(module, "bias", (channels,))
    y = g.activation(module, "out", g.shape(x))
    mean = g.activation(module, "save_mean", (channels,), STATS_DTYPE)
    invstd = g.activation(module, "save_invstd", (channels,), STATS_DTYPE)
    flops = _ELEMENTWISE_FLOPS["norm"] * g.numel(x)
    node = _Node(module, "aten::cudnn_batch_norm_backward", (y,), (x, gamma, mean, invstd),
                 (x,), (gamma, beta), flops=2 * flops)
    g.forward("aten::cudnn_batch_norm", module, (x, gamma, beta), (y, mean, invstd), node, flops)
    return y


def _layer_norm(g: _Graph, module: str, x: str) -> str:
    """Layer norm over the last dimension; saves x, and per-row mean and rstd."""
    *lead, features = g.shape(x)
    gamma, beta = g.weight(module, "weight", (features,)), g.weight(module, "bias", (features,))
    y = g.activation(module, "out", g.shape(x))
    mean = g.activation(module, "mean", tuple(lead), STATS_DTYPE)
    rstd = g.activation(module, "rstd", tuple(lead), STATS_DTYPE)
    flops = _ELEMENTWISE_FLOPS["norm"] * g.numel(x)
    node = _Node(module, "aten::native_layer_norm_backward", (y,), (x, gamma, mean, rstd),
                 (x,), (gamma, beta), flops=2 * flops)
    g.forward("aten::native_layer_norm", module, (x, gamma, beta), (y, mean, rstd), node, flops)
    return y


def _relu(g: _Graph, module: str, x: str) -> str:
    """Out-of-place ReLU; its backward (threshold_backward) reads the output."""
    y = g.activation(module, "out", g.shape(x))
    flops = _ELEMENTWISE_FLOPS["relu"] * g.numel(x)
    node = _Node(module, "aten::threshold_backward", (y,), (y,), (x,), (), flops=2 * flops)
    g.forward("aten::relu", module, (x,), (y,), node, flops)
    return y


def _gelu(g: _Graph, module: str, x: str) -> str:
    """GELU; its backward reads the input."""
    y = g.activation(module, "out", g.shape(x))
    flops = _ELEMENTWISE_FLOPS["gelu"] * g.numel(x)
    node = _Node(module, "aten::gelu_backward", (y,), (x,), (x,), (), flops=2 * flops)
    g.forward("aten::gelu", module, (x,), (y,), node, flops)
    return y


def _add(g: _Graph, module: str, a: str, b: str) -> str:
    """A residual / skip add; backward passes the gradient to both inputs with no kernel."""
    y = g.activation(module, "out", g.shape(a))
    node = _Node(module, "AddBackward0", (y,), (), (a, b), (), passthrough=True)
    g.forward("aten::add", module, (a, b), (y,), node, _ELEMENTWISE_FLOPS["add"] * g.numel(a))
    return y


def _attention(g: _Graph, module: str, qkv: str, heads: int) -> str:
    """Fused scaled-dot-product attention over one (B, S, 3 x width) qkv tensor.

    Saves qkv, the output and the logsumexp (B x heads x S, fp32).
    """
    batch, seq, three_width = g.shape(qkv)
    width = three_width // 3
    kernel = "flash" if g.dtype in ("fp16", "bf16") else "efficient"
    out = g.activation(module, "out", (batch, seq, width))
    lse = g.activation(module, "logsumexp", (batch, heads, seq), STATS_DTYPE)
    flops = 4.0 * batch * seq * seq * width
    dq_accum = batch * seq * width * ELEMENT_BYTES[STATS_DTYPE]
    node = _Node(module, f"aten::_scaled_dot_product_{kernel}_attention_backward", (out,),
                 (qkv, out, lse), (qkv,), (), flops=2.5 * flops, workspace=dq_accum)
    g.forward(f"aten::_scaled_dot_product_{kernel}_attention", module, (qkv,), (out, lse),
              node, flops)
    return out


def _cross_entropy(g: _Graph, module: str, logits: str, labels: str) -> str:
    """Fused log-softmax + NLL to a scalar loss; its backward seeds the backward pass."""
    loss = g.activation(module, "out", ())
    flops = _ELEMENTWISE_FLOPS["softmax"] * g.numel(logits)
    node = _Node(module, "aten::cross_entropy_loss_backward", (loss,), (loss, logits, labels),
                 (logits,), (), flops=flops, seed=True)
    g.forward("aten::cross_entropy_loss", module, (logits, labels), (loss,), node, flops)
    return loss


def _avg_pool(g: _Graph, module: str, x: str) -> str:
    """Global average pooling (B, C, H, W) -> (B, C); its backward reads the input."""
    batch, channels = g.shape(x)[:2]
    y = g.activation(module, "out", (batch, channels))
    flops = _ELEMENTWISE_FLOPS["pool"] * g.numel(x)
    node = _Node(module, "aten::_adaptive_avg_pool2d_backward", (y,), (x,), (x,), (), flops=flops)
    g.forward("aten::_adaptive_avg_pool2d", module, (x,), (y,), node, flops)
    return y


def _embedding(g: _Graph, module: str, tokens: str, width: int) -> tuple[str, str]:
    """Token + position embedding; returns (output, token embedding weight)."""
    batch, seq = g.shape(tokens)
    wte = g.weight(module, "wte.weight", (VOCAB, width))
    wpe = g.weight(module, "wpe.weight", (seq, width))
    y = g.activation(module, "out", (batch, seq, width))
    flops = batch * seq * width
    node = _Node(module, "aten::embedding_dense_backward", (y,), (tokens,), (), (wte, wpe),
                 flops=2 * flops)
    g.forward("aten::embedding", module, (tokens, wte, wpe), (y,), node, flops)
    return y, wte


# ----------------------------------------------------------------------------- models


def mlp(*, layers: int = 8, width: int = 4096, batch: int = 256,
        hardware: str | Hardware = DEFAULT_HARDWARE, dtype: str = "fp32") -> Profile:
    """A multilayer perceptron: ``layers`` x (Linear(width, width) + ReLU), Linear(width, 1000).

    The input has ``width`` features. Raises InputError for a bad parameter.
    """
    hw = _check("mlp", layers, width, batch, None, hardware, dtype)
    g = _Graph(hw, dtype)
    x = g.tensor("batch.features", (batch, width), "input")
    labels = g.tensor("batch.labels", (batch,), "input", INDEX_DTYPE)
    for i in range(layers):
        x = _relu(g, f"layer{i}.relu", _linear(g, f"layer{i}.fc", x, width))
    logits = _linear(g, "head", x, CLASSES)
    _cross_entropy(g, "loss", logits, labels)
    return g.profile(*_identity("mlp", layers, width, batch, None, hw, dtype))


def cnn(*, layers: int = 8, width: int = 64, batch: int = 64, side: int = 112,
        hardware: str | Hardware = DEFAULT_HARDWARE, dtype: str = "fp32") -> Profile:
    """A ResNet-style CNN of ``layers`` basic blocks on ``side`` x ``side`` RGB images.

    ``width`` is the stem's channel count (doubled in each later stage). Raises
    InputError for a bad parameter.
    """
    hw = _check("cnn", layers, width, batch, side, hardware, dtype)
    g = _Graph(hw, dtype)
    images = g.tensor("batch.images", (batch, 3, side, side), "input")
    labels = g.tensor("batch.labels", (batch,), "input", INDEX_DTYPE)
    x = _relu(g, "stem.relu", _batch_norm(g, "stem.bn", _conv(g, "stem.conv", images, width, 3, 1)))
    for stage, blocks in enumerate(_stage_sizes(layers)):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(g, f"stage{stage}.block{block}", x, width * 2**stage, stride)
    logits = _linear(g, "fc", _avg_pool(g, "pool", x), CLASSES)
    _cross_entropy(g, "loss", logits, labels)
    return g.profile(*_identity("cnn", layers, width, batch, side, hw, dtype))


def _stage_sizes(layers: int) -> list[int]:
    """Blocks per stage: near-equal, earlier stages take the remainder (8 -> 3, 3, 2)."""
    base, extra = divmod(layers, CNN_STAGES)
    return [base + (stage < extra) for stage in range(CNN_STAGES)]


def _basic_block(g: _Graph, name: str, x: str, channels: int, stride: int) -> str:
    """conv3x3-bn-relu-conv3x3-bn, plus the skip (a 1x1 projection when the shape changes), relu."""
    y = _relu(g, f"{name}.relu1",
              _batch_norm(g, f"{name}.bn1", _conv(g, f"{name}.conv1", x, channels, 3, stride)))
    y = _batch_norm(g, f"{name}.bn2", _conv(g, f"{name}.conv2", y, channels, 3, 1))
    skip = x
    if stride != 1 or g.shape(x)[1] != channels:
        skip = _batch_norm(g, f"{name}.proj.bn",
                           _conv(g, f"{name}.proj.conv", x, channels, 1, stride))
    return _relu(g, f"{name}.relu2", _add(g, f"{name}.add", y, skip))


def transformer(*, layers: int = 12, width: int = 768, batch: int = 8, seq: int = 512,
                hardware: str | Hardware = DEFAULT_HARDWARE, dtype: str = "fp32") -> Profile:
    """A GPT-2-like decoder (defaults: GPT-2 small) trained on ``batch`` x ``seq`` tokens.

    ``width`` must be a multiple of 64 (heads = width / 64). Raises InputError for a
    bad parameter.
    """
    hw = _check("transformer", layers, width, batch, seq, hardware, dtype)
    g = _Graph(hw, dtype)
    tokens = g.tensor("batch.tokens", (batch, seq), "input", INDEX_DTYPE)
    labels = g.tensor("batch.labels", (batch, seq), "input", INDEX_DTYPE)
    x, wte = _embedding(g, "embed", tokens, width)
    for i in range(layers):
        x = _transformer_block(g, f"layer{i}", x, width // HEAD_DIM)
    y = _layer_norm(g, "ln_f", x)
    logits = _linear(g, "lm_head", y, VOCAB, bias=False, weight=wte)
    _cross_entropy(g, "loss", logits, labels)
    return g.profile(*_identity("transformer", layers, width, batch, seq, hw, dtype))


def _transformer_block(g: _Graph, name: str, x: str, heads: int) -> str:
    """Pre-norm block: x + proj(attn(qkv(ln1(x)))), then h + fc2(gelu(fc1(ln2(h))))."""
    width = g.shape(x)[-1]
    qkv = _linear(g, f"{name}.qkv", _layer_norm(g, f"{name}.ln1", x), 3 * width)
    attn = _linear(g, f"{name}.proj", _attention(g, f"{name}.attn", qkv, heads), width)
    h = _add(g, f"{name}.add1", x, attn)
    hidden = _gelu(g, f"{name}.gelu", _linear(g, f"{name}.fc1", _layer_norm(g, f"{name}.ln2", h),
                                               4 * width))
    return _add(g, f"{name}.add2", h, _linear(g, f"{name}.fc2", hidden, width))


# ----------------------------------------------------------------------------- entry point


def synthesize(model: str, *, layers: int | None = None, width: int | None = None,
               batch: int | None = None, seq: int | None = None,
               hardware: str | Hardware = DEFAULT_HARDWARE, dtype: str = "fp32") -> Profile:
    """Build the synthetic profile of ``model`` (one of MODELS); None means the default.

    Parameters
    ----------
    model : "mlp", "cnn" or "transformer"
    layers, width, batch : blocks, hidden size (cnn: stem channels), samples per batch.
    seq : the transformer's sequence length; the cnn's image side in pixels; ignored by
        the mlp.
    hardware : a preset name, a hardware file, or a Hardware; times the kernels.
    dtype : "fp32", "fp16" or "bf16".

    Returns
    -------
    Profile, named ``synth-<model>-l<layers>[-w<width>]-b<batch>[-s<seq>][-<dtype>]
    [-<hardware>]``: width only when it is not the model's default, seq not for the
    mlp, dtype only when not fp32, hardware only when not the default preset.

    Raises
    ------
    InputError("<argument>", parameter, problem) for an unknown model or a bad value.

    Example
    -------
    >>> synthesize("transformer", batch=16, seq=1024).name
    'synth-transformer-l12-b16-s1024'
    """
    if model not in MODELS:
        raise InputError("<argument>", "model",
                         f"unknown model {model!r} (use {', '.join(MODELS)})")
    given = {"layers": layers, "width": width, "batch": batch, "seq": seq}
    args = {key: DEFAULTS[model][key] if value is None else value for key, value in given.items()}
    common = {"layers": args["layers"], "width": args["width"], "batch": args["batch"],
              "hardware": hardware, "dtype": dtype}
    if model == "mlp":
        return mlp(**common)
    if model == "cnn":
        return cnn(side=args["seq"], **common)
    return transformer(seq=args["seq"], **common)


def _check(model: str, layers, width, batch, seq, hardware, dtype: str) -> Hardware:
    """Validate the parameters (InputError naming the first bad one) and load the hardware."""
    for key, value in (("layers", layers), ("width", width), ("batch", batch), ("seq", seq)):
        if key == "seq" and model == "mlp":
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError("<argument>", key, f"expected a whole number, got {value!r}")
        if value < 1:
            raise InputError("<argument>", key, f"must be >= 1, got {value}")
    at_least = layers * _TENSORS_PER_LAYER[model]
    if at_least > MAX_COUNT:  # R23, refused before building anything
        raise InputError("<argument>", "layers",
                         f"{layers} layers make at least {at_least} tensors; at most {MAX_COUNT} are "
                         f"supported (R23), so at most {MAX_COUNT // _TENSORS_PER_LAYER[model]} layers")
    if model == "transformer" and width % HEAD_DIM:
        raise InputError("<argument>", "width",
                         f"must be a multiple of {HEAD_DIM} (heads = width / {HEAD_DIM}), got {width}")
    if dtype not in DTYPE_BYTES:
        raise InputError("<argument>", "dtype",
                         f"unknown dtype {dtype!r} (use {', '.join(DTYPE_BYTES)})")
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    peak_tflops(hw, dtype)  # raises InputError when the GPU lacks the dtype (bf16)
    return hw


def _identity(model: str, layers: int, width: int, batch: int, seq: int | None,
              hw: Hardware, dtype: str) -> tuple[str, dict]:
    """The profile name and source of one parameter set."""
    parts = [f"synth-{model}", f"l{layers}"]
    if width != DEFAULTS[model]["width"]:
        parts.append(f"w{width}")
    parts.append(f"b{batch}")
    if seq is not None:
        parts.append(f"s{seq}")
    if dtype != "fp32":
        parts.append(dtype)
    if hw.name != DEFAULT_HARDWARE:
        parts.append(hw.name)
    command = f"swapplan synth {model} --layers {layers} --width {width} --batch {batch}"
    if seq is not None:
        command += f" --seq {seq}"
    command += f" --dtype {dtype} --hardware {hw.name}"
    source = {"kind": "synthetic", "from": command, "timing": f"roofline:{hw.name}",
              "batch": batch, "model": model, "layers": layers, "width": width,
              "seq": seq, "dtype": dtype}
    return "-".join(parts), source
