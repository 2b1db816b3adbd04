"""Small models to check a runtime against the simulator (``module:callable`` specs,
``runtime.small_models:blocks``): each returns (module, inputs, loss_fn, targets) or a
Hugging Face model and its inputs, as ``swapplan trace`` takes them (docs/tracing.md).

They cover what makes real memory differ from a byte count: multi-output ops
(``native_dropout``, ``native_layer_norm``, attention with saved statistics), random ops,
in-place updates (batch norm, in-place ReLU, residual adds) and the optimizer's
temporaries. Sized so that a traced step runs in well under a second on one CPU thread.
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
