"""Small models to check a runtime against the simulator (``module:callable`` specs,
``runtime.small_models:blocks``): each returns (module, inputs, loss_fn, targets) or a
Hugging Face model and its inputs, as ``swapplan trace`` takes them (docs/tracing.md).

They cover what makes real memory differ from a byte count: multi-output ops
(``native_dropout``, ``native_layer_norm``, attention with saved statistics), random ops,
in-place updates (batch norm, in-place ReLU, residual adds) and the optimizer's
temporaries; and shapes of user code the first ones lack: broadcast channel weights
(squeeze-and-excitation), grouped convolutions, one weight read twice (tied embeddings),
``torch.nn.TransformerEncoder`` under a causal mask, attention written out by hand. Sized
so that a traced step runs in well under a second on one CPU thread.
"""
from __future__ import annotations

import torch

from tracer import models


def mlp(batch=1024):
    """Four linear layers with ReLU, cross-entropy over 10 classes; a large batch, so that
    activations (which plans move) outweigh the weights and optimizer state."""
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    return net, (torch.empty(batch, 32),), torch.nn.functional.cross_entropy, (torch.empty(batch, dtype=torch.long),)


def mlp_dropout(batch=512):
    """The MLP with dropout after each ReLU (fused dropout: random ops)."""
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                              torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                              torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                              torch.nn.Linear(64, 10))
    return net, (torch.empty(batch, 32),), torch.nn.functional.cross_entropy, (torch.empty(batch, dtype=torch.long),)


def ln_dropout_mlp(batch=256, width=64, layers=3):
    """Linear, layer norm, ReLU, dropout per layer: two multi-output ops per layer."""
    parts = []
    for _ in range(layers):
        parts += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.ReLU(), torch.nn.Dropout(0.2)]
    net = torch.nn.Sequential(torch.nn.Linear(32, width), *parts, torch.nn.Linear(width, 10))
    return net, (torch.empty(batch, 32),), torch.nn.functional.cross_entropy, (torch.empty(batch, dtype=torch.long),)


class _Block(torch.nn.Module):
    """A pre-norm transformer block: layer norm, self-attention with dropout, layer norm,
    an MLP with dropout."""

    def __init__(self, width: int, heads: int, p: float = 0.1):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(width)
        self.attn = torch.nn.MultiheadAttention(width, heads, dropout=p, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Dropout(p),
                                       torch.nn.Linear(4 * width, width), torch.nn.Dropout(p))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class _MeanTokens(torch.nn.Module):
    def forward(self, x):
        return x.mean(dim=1)


def blocks(batch=8, seq=16, width=32, heads=4, layers=2):
    """Two transformer blocks (layer norm, attention and MLP dropout) and a classifier over
    the mean token."""
    net = torch.nn.Sequential(*[_Block(width, heads) for _ in range(layers)], _MeanTokens(),
                              torch.nn.Linear(width, 10))
    return (net, (torch.empty(batch, seq, width),), torch.nn.functional.cross_entropy,
            (torch.empty(batch, dtype=torch.long),))


def tiny_resnet(batch=8, seq=32):
    """One bottleneck block per stage, stem width 8: batch norm (running statistics
    updated in place), in-place ReLU and residual adds."""
    net = models.ResNet((1, 1, 1, 1), classes=10, width=8)
    return (net, (torch.empty(batch, 3, seq, seq),), torch.nn.functional.cross_entropy,
            (torch.empty(batch, dtype=torch.long),))


def tiny_gpt2(batch=4, seq=32):
    """HF GPT-2 (needs transformers), 2 layers of width 64, its default dropouts (embedding,
    residual, attention: efficient attention with dropout)."""
    import transformers
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                     bos_token_id=0, eos_token_id=0, use_cache=False,
                                     attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    ids = torch.empty(batch, seq, dtype=torch.long)
    return model, {"input_ids": ids, "labels": ids}


class _Squeeze(torch.nn.Module):
    """Squeeze-and-excitation: channel weights from the pooled map, multiplied in (broadcast)."""

    def __init__(self, channels: int):
        super().__init__()
        self.reduce = torch.nn.Conv2d(channels, channels // 4, 1)
        self.expand = torch.nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x):
        pooled = torch.nn.functional.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(torch.nn.functional.silu(self.reduce(pooled))))


class _SEBlock(torch.nn.Module):
    """Depthwise and pointwise convolutions with batch norm, squeeze-and-excitation, an
    in-place residual add and an in-place ReLU."""

    def __init__(self, channels: int):
        super().__init__()
        self.depthwise = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.pointwise = torch.nn.Conv2d(channels, channels, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)
        self.squeeze = _Squeeze(channels)
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.relu(self.bn1(self.depthwise(x)))
        y = self.squeeze(self.bn2(self.pointwise(y)))
        y += x
        return self.relu(y)


def se_cnn(batch=8, seq=16):
    """Three squeeze-and-excitation blocks behind a convolution stem, max pooling between."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                              torch.nn.ReLU(inplace=True), _SEBlock(16), torch.nn.MaxPool2d(2), _SEBlock(16),
                              _SEBlock(16), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(16, 10))
    return (net, (torch.empty(batch, 3, seq, seq),), torch.nn.functional.cross_entropy,
            (torch.empty(batch, dtype=torch.long),))


class _TiedLM(torch.nn.Module):
    """torch.nn.TransformerEncoder (pre-norm, GELU, dropout) under a causal mask, its
    output projection the embedding's own weight (tied: one tensor, two uses)."""

    def __init__(self, vocab: int, width: int, layers: int, longest: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.zeros(1, longest, width))
        layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1, activation="gelu",
                                                 batch_first=True, norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, ids):
        seq = ids.shape[1]
        x = self.embed(ids) + self.position[:, :seq]
        x = self.encoder(x, mask=torch.nn.Transformer.generate_square_subsequent_mask(seq), is_causal=True)
        return (self.norm(x) @ self.embed.weight.t()).flatten(0, 1)


def tied_lm(batch=4, seq=16):
    """A two-layer causal language model with tied input and output embeddings."""
    net = _TiedLM(vocab=128, width=32, layers=2, longest=max(seq, 64))
    return (net, (torch.empty(batch, seq, dtype=torch.long),), torch.nn.functional.cross_entropy,
            (torch.empty(batch * seq, dtype=torch.long),))


class _ManualAttention(torch.nn.Module):
    """Attention written out by hand, as in many research repositories: one QKV linear,
    scores, a causal masked_fill, softmax, dropout, and a classifier over the mean token."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, 10)
        self.heads = heads

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / (w // self.heads) ** 0.5
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        weights = torch.nn.functional.dropout(scores.softmax(-1), 0.1, training=self.training)
        x = x + self.proj((weights @ v).transpose(1, 2).reshape(b, t, w))
        return self.head(x.mean(1))


def manual_attention(batch=8, seq=16, width=32, heads=4):
    """One hand-written causal attention layer with a residual add and a classifier."""
    return (_ManualAttention(width, heads), (torch.empty(batch, seq, width),), torch.nn.functional.cross_entropy,
            (torch.empty(batch, dtype=torch.long),))
