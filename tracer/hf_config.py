"""Transformers config files for ``swapplan trace --hf-config``: reading and bounds, without torch.

:func:`read_config` reads a config.json (a regular file only, through
:func:`simulator.files.read_bytes`: a FIFO, a device or a folder is refused at once; a
UTF-8 byte-order mark is accepted) and checks its size fields (:func:`check_fields`).
:func:`check_bounds` refuses what a trace could not finish, before anything is built.
Tracing builds the model as Python modules on the meta device (no weights) and records
its step node by node on fake tensors: the memory and time of a trace grow with the
number of layers (some 3 MiB and most of a second per decoder layer on a small machine),
not with the widths; the profile it writes holds sizes below 2^53 bytes. So a config may
ask for at most

- :data:`MAX_LAYERS` layers, and no more than the memory available to the trace allows
  (:data:`TRACE_BASE_BYTES` plus :data:`TRACE_LAYER_BYTES` per layer, against Linux
  ``MemAvailable``);
- :data:`MAX_WIDTH` for each width (hidden size, intermediate size, heads, head size) and
  :data:`MAX_VOCAB` tokens of vocabulary;
- :data:`MAX_PARAMETERS` parameters (estimated from the fields before the build, counted
  after it);
- a training step (weights, gradients and optimizer state at 16 bytes a parameter, and
  activations of about ``batch x seq x hidden x layers x 34`` bytes, the saved
  activations of a transformer layer) of less than :data:`MAX_STEP_BYTES` (2^53 bytes,
  8 PiB: the largest size swapplan represents exactly).

Each refusal is an InputError naming the file (or ``<argument>``), the field and the limit.
The estimates are lower bounds for a decoder of the usual shape (tied embeddings, a
two-matrix MLP), so that a config is never refused for what it would not need.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from simulator.errors import InputError
from simulator.files import read_bytes
from simulator.units import MAX_BYTES

CONFIG_DIR = Path(__file__).resolve().parent / "configs"

MAX_LAYERS = 1024                 # the deepest published LLMs have some 130
MAX_WIDTH = 2**20                 # hidden / intermediate size, heads, head size (published: < 2^17)
MAX_VOCAB = 2**24                 # tokens (published: < 2^19)
MAX_PARAMETERS = 10**13           # 10 trillion (160 TB of AdamW training state)
MAX_STEP_BYTES = MAX_BYTES        # 2^53: sizes above it are not exact in a float
STATE_BYTES_PER_PARAMETER = 16    # fp32 weight and gradient + AdamW moments; amp: bf16 pair + fp32 master
ACTIVATION_BYTES = 34             # per token x hidden x layer (Korthikanti et al. 2022, fp16, no recompute)
TRACE_BASE_BYTES = 512 * 2**20    # torch, transformers and the tracer
TRACE_LAYER_BYTES = 8 * 2**20     # per layer: modules, the FX graph (twice with --density), the profile

# Size fields of transformers configs (each family names some of them): when present and
# not null, each must be a whole number >= 1 (checked before transformers sees them, so
# that the error names the field).
HF_SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "intermediate_size", "vocab_size", "max_position_embeddings", "head_dim",
                  "n_embd", "n_layer", "n_head", "n_inner", "n_positions", "ffn_dim", "d_model",
                  "num_layers", "num_heads", "sliding_window")
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")
HIDDEN_FIELDS = ("hidden_size", "n_embd", "d_model")
INTERMEDIATE_FIELDS = ("intermediate_size", "n_inner", "ffn_dim")
HEAD_FIELDS = ("num_attention_heads", "n_head", "num_heads")
WIDTH_FIELDS = HIDDEN_FIELDS + INTERMEDIATE_FIELDS + HEAD_FIELDS + ("num_key_value_heads", "head_dim")


def shipped_configs() -> list[Path]:
    """The config.json files shipped in ``tracer/configs``."""
    return sorted(CONFIG_DIR.glob("*.json"))


def config_path(path) -> Path:
    """``path``, or the shipped config of that name (``llama2-13b`` is
    ``tracer/configs/llama2-13b.json``) when no such file exists."""
    given = Path(path)
    try:
        exists = given.exists() or given.is_symlink()
    except (OSError, ValueError):   # a name too long, a NUL byte
        exists = False
    if not exists and given.name == str(path):
        shipped = CONFIG_DIR / (given.name if given.suffix == ".json" else f"{given.name}.json")
        if shipped.is_file():
            return shipped
    return given


def read_config(path) -> dict:
    """The JSON object of a config file (a regular file; a UTF-8 byte-order mark is
    accepted), its size fields checked (:func:`check_fields`); InputError naming the file
    for anything else."""
    file = str(path)
    try:
        raw = read_bytes(path)
    except InputError as exc:
        if exc.problem == "no such file":
            shipped = ", ".join(p.stem for p in shipped_configs())
            raise InputError(file, "hf-config", f"no such file (shipped configs: {shipped})") from None
        raise InputError(file, "hf-config", exc.problem) from None
    except ValueError as exc:   # a NUL byte in the path
        raise InputError(file, "hf-config", f"cannot read it: {exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(file, f"byte {exc.start}", "not valid UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(file, f"line {exc.lineno}", f"not valid JSON: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:   # an int of more than 4300 digits, deep nesting
        raise InputError(file, "", f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(file, "", f"expected a JSON object (a transformers config), "
                                   f"got {type(data).__name__}")
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError(file, "model_type", "missing: a transformers config names its "
                                             "model_type (llama, mistral, gpt2, ...)")
    check_fields(file, data)
    return data


def check_fields(file: str, data: dict) -> None:
    """InputError naming the field for a size that is not a whole number >= 1, a hidden
    size that the heads do not divide, or query heads that the KV heads do not divide."""
    for key in HF_SIZE_FIELDS:
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(file, key, f"expected a whole number >= 1, got {value!r}")
    hidden, heads = data.get("hidden_size"), data.get("num_attention_heads")
    if hidden and heads and data.get("head_dim") is None and hidden % heads:
        raise InputError(file, "hidden_size", f"{hidden} is not a multiple of num_attention_heads "
                                              f"({heads}) and no head_dim is given")
    kv = data.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise InputError(file, "num_key_value_heads", f"{kv} does not divide num_attention_heads "
                                                      f"({heads})")


# ----------------------------------------------------------------------------- bounds


def _getter(source) -> Callable[[str], int | None]:
    """A field's whole-number value from a dict or a transformers config (None when absent)."""
    def get(key: str) -> int | None:
        try:
            value = source.get(key) if isinstance(source, dict) else getattr(source, key, None)
        except Exception:   # an attribute_map that points nowhere
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return None
        return value
    return get


def _first(get, keys) -> tuple[str | None, int | None]:
    for key in keys:
        value = get(key)
        if value is not None:
            return key, value
    return None, None


def estimated_parameters(source) -> int | None:
    """A lower bound of the parameters of a decoder with these fields (a dict or a
    transformers config): tied embeddings and attention, two MLP matrices per layer.
    None when the hidden size or the layers are not given."""
    get = _getter(source)
    hidden = _first(get, HIDDEN_FIELDS)[1]
    layers = _first(get, LAYER_FIELDS)[1]
    if hidden is None or layers is None:
        return None
    inter = _first(get, INTERMEDIATE_FIELDS)[1] or hidden
    heads = _first(get, HEAD_FIELDS)[1]
    head_dim = get("head_dim") or (hidden // heads if heads else None)
    if heads and head_dim:
        kv = get("num_key_value_heads") or heads
        attention = hidden * head_dim * (2 * heads + 2 * kv)   # q, o; k, v
    else:
        attention = 4 * hidden * hidden
    return (get("vocab_size") or 0) * hidden + layers * (attention + 2 * hidden * inter)


def available_memory() -> int | None:
    """Linux ``MemAvailable`` in bytes, or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    return None


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def _count(value: int) -> str:
    """``1,000,000`` up to 10^15, then ``1.00e+4000`` (exact digits, whatever the size)."""
    if value < 10**15:
        return f"{value:,}"
    if value < 10**300:
        return f"{value:.2e}"
    digits = str(value)   # (a JSON int has at most 4300 digits)
    return f"{digits[0]}.{digits[1:3]}e+{len(digits) - 1}"


def check_bounds(file: str, source, *, batch: int | None = None, seq: int | None = None,
                 memory: int | None = None) -> None:
    """InputError naming ``file``, the field and the limit when the config (a dict or a
    transformers config) asks for more than a trace can build (module doc): too many
    layers for :data:`MAX_LAYERS` or for ``memory`` (bytes available; default: this
    machine's ``MemAvailable``), a width, vocabulary or estimated parameter count over
    its limit, or a training step of ``batch`` x ``seq`` tokens over :data:`MAX_STEP_BYTES`."""
    get = _getter(source)
    present = [(key, get(key)) for key in LAYER_FIELDS if get(key) is not None]   # (a family may alias them)
    for key, layers in present:
        if layers > MAX_LAYERS:
            raise InputError(file, key, f"{_count(layers)} layers, more than the {MAX_LAYERS} a trace takes (it builds "
                                        f"every layer as modules and records its step node by node: about "
                                        f"{TRACE_LAYER_BYTES >> 20} MiB of memory per layer)")
    if present:
        key, layers = max(present, key=lambda item: item[1])
        memory = available_memory() if memory is None else memory
        need = TRACE_BASE_BYTES + layers * TRACE_LAYER_BYTES
        if memory is not None and need > memory:
            raise InputError(file, key, f"{layers} layers: the trace needs about {_gib(need)} of memory "
                                        f"({TRACE_BASE_BYTES >> 20} MiB + {TRACE_LAYER_BYTES >> 20} MiB per layer) "
                                        f"and {_gib(memory)} are available here")
    for key in WIDTH_FIELDS:
        value = get(key)
        if value is not None and value > MAX_WIDTH:
            raise InputError(file, key, f"{_count(value)} is more than {MAX_WIDTH:,} (2^20), the largest width "
                                        f"a trace takes")
    vocab = get("vocab_size")
    if vocab is not None and vocab > MAX_VOCAB:
        raise InputError(file, "vocab_size", f"{_count(vocab)} tokens, more than {MAX_VOCAB:,} (2^24), the largest "
                                             f"vocabulary a trace takes")
    params = estimated_parameters(source)
    if params is None:
        return
    if params > MAX_PARAMETERS:
        raise InputError(file, "", f"about {_count(params)} parameters (from its sizes), more than "
                                   f"{MAX_PARAMETERS:,} (10^13), the most a trace takes")
    hidden = _first(get, HIDDEN_FIELDS)[1]
    tokens = (batch or 1) * (seq or 1)
    step = params * STATE_BYTES_PER_PARAMETER + tokens * hidden * layers * ACTIVATION_BYTES
    if step >= MAX_STEP_BYTES:   # (the parameters alone are at most 1.6e14 bytes: the tokens did it)
        raise InputError("<argument>", "batch, seq",
                         f"the training step of {file} at batch {batch or 1}, seq {seq or 1} needs about "
                         f"{step / 2**50:.3g} PiB ({STATE_BYTES_PER_PARAMETER} bytes per parameter + batch x seq x "
                         f"hidden x layers x {ACTIVATION_BYTES} bytes of activations), more than the 8 PiB (2^53 "
                         f"bytes) a profile holds")


def check_parameters(file: str, count: int) -> None:
    """InputError naming ``file`` when the model built has more than :data:`MAX_PARAMETERS`."""
    if count > MAX_PARAMETERS:
        raise InputError(file, "", f"{_count(count)} parameters, more than {MAX_PARAMETERS:,} (10^13), the most a "
                                   f"trace takes")


def precheck(path, *, batch: int | None = None, seq: int | None = None) -> dict:
    """Read and bound a config before torch is imported: the config's data (see
    :func:`read_config`, :func:`check_bounds`). ``path`` may name a shipped config."""
    path = config_path(path)
    data = read_config(path)
    check_bounds(str(path), data, batch=batch, seq=seq)
    return data
