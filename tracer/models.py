"""Named models for the tracer: each builds an ``nn.Module`` on the meta device plus its batch.

``build(model, batch=None, seq=None)`` returns a :class:`Workload`: the module (on
``torch.device("meta")``: no memory, no initialisation, nothing downloaded), the
batch it trains on (shapes and dtypes only), and how one training step turns the
module and the batch into a scalar loss. ``None`` for ``batch`` or ``seq`` means the
model's default. The tracer (:mod:`tracer.pytorch.trace`) fakes the tensors; nothing
here allocates real memory.

Registered models
-----------------
==============  ===============================================  =====  ======================
name            what                                             batch  seq (default, limit)
==============  ===============================================  =====  ======================
gpt2            GPT-2 small (124M), HF GPT2LMHeadModel            8      tokens 1024, <= 1024
gpt2-medium     GPT-2 medium (355M), HF GPT2LMHeadModel           8      tokens 1024, <= 1024
bert-base       BERT-base (110M), HF BertForMaskedLM              32     tokens 512, <= 512
bert-large      BERT-large (335M), HF BertForMaskedLM             16     tokens 512, <= 512
llama-1b        Llama-style decoder (~1.0B), HF LlamaForCausalLM  4      tokens 2048
vit-base        ViT-B/16 (86M), defined here                      64     image side 224, k x 16
resnet50        ResNet-50 v1.5 (25.6M), defined here              64     image side 224, >= 32
resnet152       ResNet-152 v1.5 (60.2M), defined here             32     image side 224, >= 32
vgg16           VGG-16 (138M, no batch norm), defined here        32     image side 224, >= 32
==============  ===============================================  =====  ======================

- The HF models are built from config objects (``use_cache=False``,
  ``attn_implementation="sdpa"``) with the configs' standard sizes and dropouts; the
  language models train on ``input_ids`` and ``labels`` (B x S int64) and use the
  model's own loss (``outputs.loss``: causal LM shift or masked LM over every token).
  ``llama-1b`` is a small LlamaConfig: hidden 2048, 16 layers, 32 heads (no GQA),
  intermediate 5632, vocabulary 32000, untied embeddings, no dropout.
- The vision models (torchvision-standard architectures written here in plain
  ``torch.nn``, because torchvision does not import beside the CPU torch) train on
  ``images`` (B x 3 x side x side, the model dtype) and ``labels`` (B int64) with
  ``F.cross_entropy`` over 1000 classes. ResNet and VGG use in-place ReLU (and ResNet
  an in-place residual add) as torchvision does. ViT-B/16 has no dropout (timm's
  default) and attends with ``F.scaled_dot_product_attention``.
- ``seq`` is the sequence length for language models and the image side in pixels for
  vision models.

User models: ``module:callable``
--------------------------------
``model`` may be ``"package.module:function"`` (imported with ``importlib``; the
current directory is importable). The function is called with the keyword
arguments ``batch=`` and ``seq=`` that it declares and that were given (a function
that declares neither is called with none, and then ``batch`` / ``seq`` are
refused). It returns ``(module, inputs)``, ``(module, inputs, loss_fn)`` or
``(module, inputs, loss_fn, targets)``:

- ``module``: an ``nn.Module``, ideally built under ``with torch.device("meta"):``
  (a module with real weights is moved to meta; its values are never used);
- ``inputs``: what the module is called with: a tensor, a tuple/list of tensors
  (positional arguments) or a dict of tensors (keyword arguments);
- ``loss_fn`` (optional, may be None): ``loss_fn(output, *targets)`` returning a
  scalar tensor. Without it the loss is the output itself when it is a scalar,
  else ``output.loss`` or ``output["loss"]`` when present, else
  ``output.float().sum()`` of the first tensor output (a stand-in: one reduction,
  whose gradient is a broadcast of ones, no kernel);
- ``targets`` (optional): a tensor or a tuple/list of tensors that are part of the
  batch but only go to ``loss_fn`` (labels).

Only shapes and dtypes of ``inputs`` and ``targets`` are used (real, meta or
``torch.empty`` tensors all work); floating ones take the traced dtype. Inputs and
targets are the profile's ``input`` tensors. ``batch`` in the profile's source is
the given ``batch`` or else the first input's leading dimension.

Example::

    # mymodels.py
    import torch
    def mlp(batch=32):
        with torch.device("meta"):
            net = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                      torch.nn.Linear(512, 10))
        x = torch.empty(batch, 512, device="meta")
        y = torch.empty(batch, dtype=torch.long, device="meta")
        return net, (x,), torch.nn.functional.cross_entropy, (y,)

    # swapplan trace mymodels:mlp --batch 64 -o mlp.json

Every problem (unknown name, bad ``module:callable``, bad sizes) raises
``InputError("<argument>", field, problem)``.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from simulator.errors import InputError
from tracer import hf_config

CLASSES = 1000

# ----------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class BatchTensor:
    """One tensor of the batch: shape, dtype (None: the traced floating dtype) and,
    for index tensors, the exclusive upper bound of valid values (for real runs)."""
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    high: int | None = None


@dataclass
class Workload:
    """A model and its batch, ready to trace.

    ``forward(call, batch)`` computes the scalar loss, where ``call(*args, **kwargs)``
    runs the module's forward (the tracer passes a functional call over fake
    parameters) and ``batch`` maps the names of ``inputs`` to tensors.
    """
    name: str
    module: nn.Module
    inputs: dict[str, BatchTensor]
    forward: Callable[[Callable[..., Any], dict[str, torch.Tensor]], torch.Tensor]
    batch: int
    seq: int | None
    description: str = ""
    registered: bool = True
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ModelEntry:
    """A registered model: its defaults, limits and builder."""
    name: str
    description: str
    kind: str                      # "causal-lm" | "masked-lm" | "vision"
    batch: int
    seq: int
    build: Callable[[int], nn.Module]
    vocab: int = 0
    max_seq: int | None = None
    min_seq: int = 1
    seq_multiple: int = 1


# ----------------------------------------------------------------------------- HF models


@contextlib.contextmanager
def _quiet_transformers():
    """Build HF models offline and without config warnings on stderr."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _gpt2(n_layer: int, n_embd: int, n_head: int):
    def build(seq: int) -> nn.Module:
        with _quiet_transformers():
            from transformers import GPT2Config, GPT2LMHeadModel
            config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, use_cache=False,
                                attn_implementation="sdpa")
            model = GPT2LMHeadModel(config)
            model.loss_type = "ForCausalLM"  # what transformers falls back to, without a warning
            return model
    return build


def _bert(layers: int, hidden: int, heads: int):
    def build(seq: int) -> nn.Module:
        with _quiet_transformers():
            from transformers import BertConfig, BertForMaskedLM
            config = BertConfig(num_hidden_layers=layers, hidden_size=hidden,
                                num_attention_heads=heads, intermediate_size=4 * hidden,
                                use_cache=False, attn_implementation="sdpa")
            return BertForMaskedLM(config)
    return build


def _llama(hidden: int, layers: int, heads: int, intermediate: int, vocab: int):
    def build(seq: int) -> nn.Module:
        with _quiet_transformers():
            from transformers import LlamaConfig, LlamaForCausalLM
            config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=heads, num_key_value_heads=heads,
                                 intermediate_size=intermediate, vocab_size=vocab,
                                 max_position_embeddings=max(2048, seq), use_cache=False,
                                 tie_word_embeddings=False, attn_implementation="sdpa")
            return LlamaForCausalLM(config)
    return build


# ----------------------------------------------------------------------------- vision models


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 -> 3x3 (the stride) -> 1x1 x4, in-place residual add."""
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        y += identity
        return self.relu(y)


class ResNet(nn.Module):
    """ResNet with bottleneck blocks (torchvision's layout and names); ``width`` is the
    stem's channel count (64 in the standard models)."""

    def __init__(self, blocks: tuple[int, int, int, int], classes: int = CLASSES,
                 width: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = width
        for i, count in enumerate(blocks):
            planes = width * 2**i
            layer = []
            for j in range(count):
                layer.append(Bottleneck(inplanes, planes, 2 if (i > 0 and j == 0) else 1))
                inplanes = planes * Bottleneck.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


VGG16_LAYOUT = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                512, 512, 512, "M")


class VGG(nn.Module):
    """VGG (configuration D = VGG-16 by default), no batch norm, torchvision's layout."""

    def __init__(self, layout=VGG16_LAYOUT, classes: int = CLASSES):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in layout:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, item, 3, padding=1), nn.ReLU(inplace=True)]
                channels = item
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(channels * 49, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class Attention(nn.Module):
    """Multi-head self-attention with one qkv projection and fused SDPA."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    """Pre-norm transformer encoder block (ViT)."""

    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, mlp)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(mlp, dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    """Vision transformer (ViT-B/16 by default): patch embedding, class token,
    learned position embedding, ``depth`` blocks, final norm, linear head."""

    def __init__(self, side: int = 224, patch: int = 16, dim: int = 768, depth: int = 12,
                 heads: int = 12, mlp: int = 3072, classes: int = CLASSES):
        super().__init__()
        tokens = (side // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads, mlp) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


# ----------------------------------------------------------------------------- registry


REGISTRY: dict[str, ModelEntry] = {
    entry.name: entry for entry in (
        ModelEntry("gpt2", "GPT-2 small (124M), HF GPT2LMHeadModel", "causal-lm", 8, 1024,
                   _gpt2(12, 768, 12), vocab=50257, max_seq=1024),
        ModelEntry("gpt2-medium", "GPT-2 medium (355M), HF GPT2LMHeadModel", "causal-lm", 8, 1024,
                   _gpt2(24, 1024, 16), vocab=50257, max_seq=1024),
        ModelEntry("bert-base", "BERT-base (110M), HF BertForMaskedLM", "masked-lm", 32, 512,
                   _bert(12, 768, 12), vocab=30522, max_seq=512),
        ModelEntry("bert-large", "BERT-large (335M), HF BertForMaskedLM", "masked-lm", 16, 512,
                   _bert(24, 1024, 16), vocab=30522, max_seq=512),
        ModelEntry("llama-1b", "Llama-style decoder (~1.0B: hidden 2048, 16 layers, 32 heads, "
                   "intermediate 5632, vocab 32000), HF LlamaForCausalLM", "causal-lm", 4, 2048,
                   _llama(2048, 16, 32, 5632, 32000), vocab=32000),
        ModelEntry("vit-base", "ViT-B/16 (86M)", "vision", 64, 224,
                   lambda side: ViT(side=side), min_seq=16, seq_multiple=16),
        ModelEntry("resnet50", "ResNet-50 v1.5 (25.6M)", "vision", 64, 224,
                   lambda side: ResNet((3, 4, 6, 3)), min_seq=32),
        ModelEntry("resnet152", "ResNet-152 v1.5 (60.2M)", "vision", 32, 224,
                   lambda side: ResNet((3, 8, 36, 3)), min_seq=32),
        ModelEntry("vgg16", "VGG-16 (138M), no batch norm", "vision", 32, 224,
                   lambda side: VGG(), min_seq=32),
    )
}
MODELS = tuple(REGISTRY)


def _lm_forward(call, batch):
    return call(input_ids=batch["input_ids"], labels=batch["labels"]).loss


def _vision_forward(call, batch):
    return F.cross_entropy(call(batch["images"]), batch["labels"])


def _size(value, field_name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError("<argument>", field_name, f"expected a whole number, got {value!r}")
    if value < 1:
        raise InputError("<argument>", field_name, f"must be >= 1, got {value}")
    return value


def _registered(entry: ModelEntry, batch, seq, device: str = "meta") -> Workload:
    batch = _size(batch, "batch", entry.batch)
    seq = _size(seq, "seq", entry.seq)
    what = "image side" if entry.kind == "vision" else "sequence length"
    if entry.max_seq is not None and seq > entry.max_seq:
        raise InputError("<argument>", "seq",
                         f"{entry.name} takes a {what} of at most {entry.max_seq}, got {seq}")
    if seq < entry.min_seq:
        raise InputError("<argument>", "seq",
                         f"{entry.name} needs a {what} of at least {entry.min_seq}, got {seq}")
    if seq % entry.seq_multiple:
        raise InputError("<argument>", "seq",
                         f"{entry.name} needs a {what} that is a multiple of {entry.seq_multiple}, "
                         f"got {seq}")
    with torch.device(device):
        module = entry.build(seq)
    module.train()
    if entry.kind == "vision":
        inputs = {"images": BatchTensor((batch, 3, seq, seq)),
                  "labels": BatchTensor((batch,), torch.int64, CLASSES)}
        forward = _vision_forward
    else:
        inputs = {"input_ids": BatchTensor((batch, seq), torch.int64, entry.vocab),
                  "labels": BatchTensor((batch, seq), torch.int64, entry.vocab)}
        forward = _lm_forward
    return Workload(entry.name, module, inputs, forward, batch, seq, entry.description)


# ----------------------------------------------------------------------------- user models


def _load_callable(spec: str) -> Callable:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError("<argument>", "model",
                         f"expected a registered name ({', '.join(MODELS)}) or 'module:callable', "
                         f"got {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target = importlib.import_module(module_name)
    except Exception as exc:  # an import error of any kind in the user's module
        raise InputError("<argument>", "model",
                         f"cannot import {module_name!r}: {_one_line(exc)}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise InputError("<argument>", "model", f"{module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise InputError("<argument>", "model", f"{spec!r} is not callable")
    return target


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _user(spec: str, batch, seq, device: str = "meta") -> Workload:
    fn = _load_callable(spec)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    kwargs = {}
    for key, value in (("batch", batch), ("seq", seq)):
        if value is None:
            continue
        _size(value, key, 1)
        if key not in params and not accepts_any:
            raise InputError("<argument>", key, f"{spec} does not take a {key!r} argument")
        kwargs[key] = value
    try:
        result = fn(**kwargs)
    except InputError:
        raise
    except Exception as exc:
        raise InputError("<argument>", "model", f"{spec} raised {_one_line(exc)}") from None
    if not isinstance(result, tuple) or len(result) not in (2, 3, 4):
        raise InputError("<argument>", "model", f"{spec} must return (module, inputs), "
                         "(module, inputs, loss_fn) or (module, inputs, loss_fn, targets)")
    module, example, loss_fn, targets = (*result, None, None, None)[:4]
    if not isinstance(module, nn.Module):
        raise InputError("<argument>", "model",
                         f"{spec} returned {type(module).__name__}, not an nn.Module")
    if loss_fn is not None and not callable(loss_fn):
        raise InputError("<argument>", "model", f"{spec} returned a loss_fn that is not callable")
    if isinstance(example, torch.Tensor):
        example = (example,)
    if isinstance(example, dict):
        names, by_keyword, tensors = [str(k) for k in example], True, list(example.values())
    elif isinstance(example, (tuple, list)):
        names, by_keyword = [f"input{i}" for i in range(len(example))], False
        tensors = list(example)
    else:
        raise InputError("<argument>", "model",
                         f"{spec} returned inputs of type {type(example).__name__} "
                         "(use a tensor, a tuple of tensors or a dict of tensors)")
    if targets is None:
        targets = ()
    elif isinstance(targets, torch.Tensor):
        targets = (targets,)
    if not isinstance(targets, (tuple, list)):
        raise InputError("<argument>", "model",
                         f"{spec} returned targets of type {type(targets).__name__} "
                         "(use a tensor or a tuple of tensors)")
    target_names = [f"target{i}" for i in range(len(targets))]
    inputs = {}
    for key, tensor in zip(names + target_names, tensors + list(targets)):
        if not isinstance(tensor, torch.Tensor):
            raise InputError("<argument>", "model",
                             f"{spec}: {key!r} is a {type(tensor).__name__}, not a tensor")
        dtype = None if tensor.is_floating_point() else tensor.dtype
        inputs[key] = BatchTensor(tuple(tensor.shape), dtype, None)
    if device == "meta" and any(t.device.type != "meta" for t in (*module.parameters(), *module.buffers())):
        module = module.to("meta")
    module.train()

    def forward(call, batch_tensors):
        values = [batch_tensors[k] for k in names]
        out = call(**dict(zip(names, values))) if by_keyword else call(*values)
        if loss_fn is not None:
            loss = loss_fn(out, *[batch_tensors[k] for k in target_names])
        else:
            loss = _default_loss(out)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError("the loss is not a scalar tensor")
        return loss.reshape(())

    first = tensors[0].shape[0] if tensors and tensors[0].dim() else 1
    label = spec.rpartition(":")[2].rpartition(".")[2]
    return Workload(label, module, inputs, forward, batch if batch is not None else int(first),
                    seq, f"user model {spec}", registered=False, extra={"spec": spec})


def _default_loss(out):
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        return out
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    first = out
    while isinstance(first, (tuple, list)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"cannot make a loss from a {type(out).__name__} output")
    return first.float().sum()


# ----------------------------------------------------------------------------- HF configs

CONFIG_DIR = hf_config.CONFIG_DIR
HF_BATCH = 1
HF_SEQ = 1024
# Reading and bounding a config needs no torch: tracer.hf_config (these names stay here too).
config_path = hf_config.config_path
shipped_configs = hf_config.shipped_configs
HF_SIZE_FIELDS = hf_config.HF_SIZE_FIELDS
_read_config = hf_config.read_config
_check_fields = hf_config.check_fields


def _hf_problem(exc: BaseException) -> tuple[str, str]:
    """(field, one-line problem) of an error transformers raised about a config: the
    field its validators name, if any, and its lines joined (long lists cut)."""
    import re
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = text.split(". Should contain one of")[0]  # the list of every model type
    found = re.search(r"field '(\w+)'", text)
    return (found[1] if found else ""), f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _hf_config(file: str, data: dict):
    """The transformers config object of ``data`` (its dtype fields ignored: the tracer
    sets the dtype), without a KV cache."""
    rest = {k: v for k, v in data.items() if k not in ("model_type", "torch_dtype", "dtype")}
    model_type = data["model_type"]
    with _quiet_transformers():
        import transformers
        from transformers import AutoConfig
        try:
            config = AutoConfig.for_model(model_type, **rest)
        except Exception as exc:
            where, problem = _hf_problem(exc)
            if "Unrecognized model identifier" in problem:
                raise InputError(file, "model_type", f"transformers {transformers.__version__} does "
                                                     f"not know {model_type!r}") from None
            raise InputError(file, where, f"transformers rejects the config: {problem}") from None
        from transformers.activations import ACT2FN
        for key in ("hidden_act", "activation_function"):
            act = data.get(key)
            if isinstance(act, str) and act not in ACT2FN:
                raise InputError(file, key, f"unknown activation {act!r} (transformers knows "
                                            f"{', '.join(sorted(ACT2FN)[:8])}, ...)")
    config.use_cache = False
    return config


def _hf_module(file: str, config) -> nn.Module:
    """``AutoModelForCausalLM.from_config`` on the meta device, in fp32, SDPA attention."""
    import warnings
    model_type = config.model_type
    with _quiet_transformers(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import AutoModelForCausalLM
        try:
            with torch.device("meta"):
                module = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                          dtype=torch.float32)
        except ValueError as exc:
            if "Unrecognized configuration class" in str(exc):
                raise InputError(file, "model_type", f"{model_type!r} is not a causal LM "
                                                     f"(AutoModelForCausalLM has no class for it)") from None
            where, problem = _hf_problem(exc)
            raise InputError(file, where, f"transformers cannot build the model: {problem}") from None
        except Exception as exc:
            where, problem = _hf_problem(exc)
            raise InputError(file, where, f"transformers cannot build the model: {problem}") from None
    module.loss_type = "ForCausalLM"  # what transformers falls back to, without a warning
    return module


def _config_int(file: str, config, field_name: str, required: bool = True) -> int | None:
    """A positive whole-number field of a transformers config (None when absent and optional)."""
    try:
        value = getattr(config, field_name, None)
    except Exception:  # an attribute_map that points nowhere
        value = None
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(file, field_name, f"expected a whole number >= 1, got {value!r}")
    return value


def hf_config_name(path, data: dict, config) -> str:
    """The workload name: the config file's stem, or ``<model_type>-h<hidden>-l<layers>``
    when the file is just ``config.json``."""
    stem = Path(path).name.removesuffix(".json")
    if stem and stem != "config":
        return stem
    hidden = getattr(config, "hidden_size", "?")
    layers = getattr(config, "num_hidden_layers", "?")
    return f"{data['model_type']}-h{hidden}-l{layers}"


def from_hf_config(path, *, batch: int | None = None, seq: int | None = None) -> Workload:
    """The :class:`Workload` of a transformers causal LM described by a local config.json:
    built on the meta device (no weights, no download), trained on ``input_ids`` and
    ``labels`` with its own causal LM loss. ``path`` may also name a shipped config
    (``llama2-13b``, see :func:`config_path`). ``batch`` defaults to 1 and ``seq`` to 1024,
    or to the config's position limit (``max_position_embeddings``, ``n_positions``)
    when that is smaller; a larger ``seq`` than the limit is refused.

    Raises InputError naming the file and the field (missing, unreadable, not JSON, no
    ``model_type``, a size that is not a whole number >= 1, heads that do not divide,
    rejected by transformers, not a causal LM) or the argument (bad sizes).
    """
    path = config_path(path)
    file = str(path)
    data = _read_config(path)
    batch = _size(batch, "batch", HF_BATCH)
    hf_config.check_bounds(file, data, batch=batch, seq=seq)   # before transformers builds anything
    config = _hf_config(file, data)
    vocab = _config_int(file, config, "vocab_size")
    limit = None
    for key in ("max_position_embeddings", "n_positions"):
        limit = limit or _config_int(file, config, key, required=False)
    name = hf_config_name(path, data, config)
    seq = _size(seq, "seq", min(HF_SEQ, limit or HF_SEQ))
    if limit is not None and seq > limit:
        raise InputError("<argument>", "seq", f"{name} takes a sequence length of at most {limit} "
                                              f"({file}), got {seq}")
    hf_config.check_bounds(file, config, batch=batch, seq=seq)   # with the defaults transformers filled in
    module = _hf_module(file, config)
    hf_config.check_parameters(file, parameter_count(module))
    module.train()
    inputs = {"input_ids": BatchTensor((batch, seq), torch.int64, vocab),
              "labels": BatchTensor((batch, seq), torch.int64, vocab)}
    description = (f"{data['model_type']} from {file} "
                   f"({parameter_count(module) / 1e9:.2f}B parameters), HF {type(module).__name__}")
    return Workload(name, module, inputs, _lm_forward, batch, seq, description, registered=False,
                    extra={"hf_config": file, "model_type": data["model_type"]})


# ----------------------------------------------------------------------------- entry point


def build(model: str, *, batch: int | None = None, seq: int | None = None,
          device: str = "meta") -> Workload:
    """The :class:`Workload` of a registered name or a ``module:callable`` string.

    ``device``: where a registered model is built ("meta", the default: no memory; "cpu"
    for a real run, initialised as the model's own code does). A user model is moved to
    the meta device when ``device`` is "meta", else left where its callable builds it.

    Raises InputError("<argument>", field, problem) for an unknown name, a bad
    ``module:callable`` or bad sizes.
    """
    if not isinstance(model, str) or not model:
        raise InputError("<argument>", "model", f"expected a model name, got {model!r}")
    entry = REGISTRY.get(model)
    if entry is not None:
        return _registered(entry, batch, seq, device)
    if ":" not in model:
        raise InputError("<argument>", "model",
                         f"unknown model {model!r} (use {', '.join(MODELS)}, or module:callable)")
    return _user(model, batch, seq, device)


def defaults(model: str) -> tuple[int, int]:
    """The default (batch, seq) of a registered model."""
    entry = REGISTRY[model]
    return entry.batch, entry.seq


def parameter_count(module: nn.Module) -> int:
    """Trainable parameters (tied ones once)."""
    return sum(math.prod(p.shape) for p in module.parameters())
