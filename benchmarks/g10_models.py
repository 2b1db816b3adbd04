"""G10's five workloads (MICRO'23, Fig. 11) as ``module:callable`` models for ``swapplan trace``.

    swapplan trace benchmarks.g10_models:inception_v3 --batch 1536 --optimizer sgd -o inc.json.gz
    swapplan trace benchmarks.g10_models:senet154 --batch 1024 --optimizer sgd -o senet.json.gz

Each callable takes ``batch=`` and ``seq=`` (the image side in pixels, or the sequence length
for BERT) and returns ``(module, inputs, loss_fn, targets)`` built on the meta device, as
docs/tracing.md ("Your own model") describes. Written here in plain ``torch.nn`` (torchvision
does not import beside the CPU build of torch); the architectures follow the papers, with
torchvision's (Inception-v3) and the ``legacy_senet154`` model's (SENet-154) layout and names.

What G10's artifact (github.com/platformxlab/G10, commit de2c8c6) traces, read from its
``frontend/Nets/*.txt``, ``frontend/Nets/original/vit_bs16.json`` and
``src/resources/genconfigs.py``:

==============  =======================================================================
workload        G10's model
==============  =======================================================================
BERT_Base b256  BERT-base encoder at sequence length 128 (vocabulary 30522, hidden 768,
                12 layers, 12 heads, FFN 3072), ending at the pooler (dense + tanh); no
                MLM head and no dropout in its graph: :func:`bert_base_g10`
VIT b1280       12 layers, hidden 384, 6 heads, MLP 1536, patch 32 at 224 x 224 (49
                patches + a class token), 1000 classes: a ViT-S/32, not ViT-B/16:
                :func:`vit_g10`
Inceptionv3     torchvision's Inception-v3 at 299 x 299, *without* the auxiliary
b1536           classifier (its listing has no AuxLogits), dropout 0.5 before the fc:
                :func:`inception_v3`
ResNet152 b1280 torchvision's ResNet-152 at 224 x 224: the registered ``resnet152``
SENet154 b1024  SENet-154 at 224 x 224: :func:`senet154` (see the note below)
==============  =======================================================================

All fp32 (its kernels are written on ``float``), trained with plain SGD (its ``Apply_Grad``
kernels update each weight from its gradient, no optimizer state); ``swapplan trace`` has
SGD with momentum 0.9 as its nearest optimizer (4 more bytes per parameter).

Parameter counts (counted by tests/test_g10_workloads.py)
---------------------------------------------------------
- :func:`inception_v3`: 23,834,568 (the published 23.8M without the auxiliary classifier);
  :func:`inception_v3_aux`: 27,161,264 (torchvision's 27.2M with it).
- :func:`senet154`: 115,088,984 (the published 115.1M).
- :func:`vit_g10`: 22,878,952 (ViT-S/32's 22.9M).
- :func:`bert_base_g10`: 109,483,778 (BERT-base's 110M: 109,482,240 with the pooler, plus
  a 768 x 2 classifier).

SENet-154 as G10 simulated it
-----------------------------
G10's ``SENet154.txt`` is a printed pytorchcv ``senet154`` in which the 3 x 3 convolutions
show no ``groups`` (its parser has no such field, so its kernels ran dense 3 x 3
convolutions), the SE gate prints as ReLU and the final pool as a 7 x 7 max pool. The
activations are the same shapes either way; the weights and the 3 x 3 convolutions' FLOPs
are not. :func:`senet154` is the published model (64 groups); :func:`senet154_dense` is
the same with dense 3 x 3 convolutions, to see how much that changes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CLASSES = 1000


def _image_batch(batch: int, side: int):
    """Images (B x 3 x side x side, the traced dtype) and labels (B int64), on meta."""
    images = torch.empty(batch, 3, side, side, device="meta")
    labels = torch.empty(batch, dtype=torch.int64, device="meta")
    return images, labels


# ----------------------------------------------------------------------------- Inception-v3


class BasicConv2d(nn.Module):
    """Convolution (no bias), batch norm (eps 0.001), in-place ReLU: Inception-v3's unit."""

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)), inplace=True)


class InceptionA(nn.Module):
    """35 x 35 module (Fig. 5 of Szegedy et al. 2016): 1x1, 5x5, double 3x3, pool branches."""

    def __init__(self, cin: int, pool_features: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, 1)
        self.branch5x5_1 = BasicConv2d(cin, 48, 1)
        self.branch5x5_2 = BasicConv2d(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, 1)

    def forward(self, x):
        a = self.branch1x1(x)
        b = self.branch5x5_2(self.branch5x5_1(x))
        c = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        d = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([a, b, c, d], 1)


class InceptionB(nn.Module):
    """Grid reduction 35 -> 17 (Fig. 10): strided 3x3, strided double 3x3, max pool."""

    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, stride=2)

    def forward(self, x):
        a = self.branch3x3(x)
        b = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        c = F.max_pool2d(x, 3, stride=2)
        return torch.cat([a, b, c], 1)


class InceptionC(nn.Module):
    """17 x 17 module with factorised 7x7 convolutions (Fig. 6), ``c7`` inner channels."""

    def __init__(self, cin: int, c7: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, 1)
        self.branch7x7_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7_2 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, (1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x):
        a = self.branch1x1(x)
        b = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        c = self.branch7x7dbl_1(x)
        for layer in (self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4, self.branch7x7dbl_5):
            c = layer(c)
        d = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([a, b, c, d], 1)


class InceptionD(nn.Module):
    """Grid reduction 17 -> 8: strided 3x3 after 1x1, strided 3x3 after 1x7 / 7x1, max pool."""

    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, 192, 1)
        self.branch3x3_2 = BasicConv2d(192, 320, 3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, 192, 1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, 3, stride=2)

    def forward(self, x):
        a = self.branch3x3_2(self.branch3x3_1(x))
        b = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
        c = F.max_pool2d(x, 3, stride=2)
        return torch.cat([a, b, c], 1)


class InceptionE(nn.Module):
    """8 x 8 module with expanded filter banks (Fig. 7): 1x3 and 3x1 outputs side by side."""

    def __init__(self, cin: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 320, 1)
        self.branch3x3_1 = BasicConv2d(cin, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x):
        a = self.branch1x1(x)
        b = self.branch3x3_1(x)
        b = torch.cat([self.branch3x3_2a(b), self.branch3x3_2b(b)], 1)
        c = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        c = torch.cat([self.branch3x3dbl_3a(c), self.branch3x3dbl_3b(c)], 1)
        d = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([a, b, c, d], 1)


class InceptionAux(nn.Module):
    """The auxiliary classifier on the 17 x 17 grid (5x5 / 3 average pool, 1x1, 5x5, fc)."""

    def __init__(self, cin: int, classes: int):
        super().__init__()
        self.conv0 = BasicConv2d(cin, 128, 1)
        self.conv1 = BasicConv2d(128, 768, 5)
        self.fc = nn.Linear(768, classes)

    def forward(self, x):
        x = self.conv1(self.conv0(F.avg_pool2d(x, 5, stride=3)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Inception3(nn.Module):
    """Inception-v3 (Szegedy et al., "Rethinking the Inception Architecture for Computer
    Vision", CVPR 2016) in torchvision's layout and names, for 299 x 299 images.
    With ``aux_logits`` the forward returns ``(logits, aux_logits)`` as torchvision's does
    in training."""

    def __init__(self, classes: int = CLASSES, aux_logits: bool = False, dropout: float = 0.5):
        super().__init__()
        self.aux_logits = aux_logits
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
        self.maxpool1 = nn.MaxPool2d(3, stride=2)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
        self.maxpool2 = nn.MaxPool2d(3, stride=2)
        self.Mixed_5b = InceptionA(192, 32)
        self.Mixed_5c = InceptionA(256, 64)
        self.Mixed_5d = InceptionA(288, 64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, 128)
        self.Mixed_6c = InceptionC(768, 160)
        self.Mixed_6d = InceptionC(768, 160)
        self.Mixed_6e = InceptionC(768, 192)
        self.AuxLogits = InceptionAux(768, classes) if aux_logits else None
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        x = self.maxpool1(self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x))))
        x = self.maxpool2(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)))
        x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
        x = self.Mixed_6e(self.Mixed_6d(self.Mixed_6c(self.Mixed_6b(self.Mixed_6a(x)))))
        aux = self.AuxLogits(x) if self.AuxLogits is not None and self.training else None
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        x = self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))
        return x if aux is None else (x, aux)


def _inception_loss(out, labels):
    """Cross entropy; with the auxiliary classifier, torchvision's recipe: main + 0.4 x aux."""
    if isinstance(out, tuple):
        return F.cross_entropy(out[0], labels) + 0.4 * F.cross_entropy(out[1], labels)
    return F.cross_entropy(out, labels)


def inception_v3(batch: int = 1536, seq: int = 299):
    """Inception-v3 without the auxiliary classifier (G10's Inceptionv3), images ``seq`` x ``seq``
    (299 by default; at least 75)."""
    with torch.device("meta"):
        net = Inception3(aux_logits=False)
    images, labels = _image_batch(batch, seq)
    return net, (images,), _inception_loss, (labels,)


def inception_v3_aux(batch: int = 1536, seq: int = 299):
    """Inception-v3 with the auxiliary classifier, trained on main + 0.4 x auxiliary loss."""
    with torch.device("meta"):
        net = Inception3(aux_logits=True)
    images, labels = _image_batch(batch, seq)
    return net, (images,), _inception_loss, (labels,)


# ----------------------------------------------------------------------------- SENet-154


class SEModule(nn.Module):
    """Squeeze and excitation: global average pool, 1x1 down by ``reduction`` (ReLU), 1x1
    up (sigmoid), channel-wise scale of the input."""

    def __init__(self, channels: int, reduction: int):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, channels // reduction, 1)
        self.fc2 = nn.Conv2d(channels // reduction, channels, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        s = torch.sigmoid(self.fc2(F.relu(self.fc1(s), inplace=True)))
        return x * s


class SEBottleneck(nn.Module):
    """SENet-154's bottleneck: 1x1 to 2 x planes, grouped 3x3 (the stride) to 4 x planes,
    1x1, SE, residual add, ReLU."""
    expansion = 4

    def __init__(self, inplanes: int, planes: int, groups: int, reduction: int, stride: int = 1,
                 downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes * 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes * 2)
        self.conv2 = nn.Conv2d(planes * 2, planes * 4, 3, stride=stride, padding=1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(planes * 4)
        self.conv3 = nn.Conv2d(planes * 4, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.se_module = SEModule(planes * 4, reduction)
        self.downsample = downsample

    def forward(self, x):
        residual = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.se_module(self.bn3(self.conv3(y)))
        return self.relu(y + residual)


class SENet154(nn.Module):
    """SENet-154 (Hu et al., "Squeeze-and-Excitation Networks", CVPR 2018 / TPAMI 2019):
    the ``legacy_senet154`` layout. A stem of three 3x3 convolutions (64, 64, 128) and a
    3 x 3 / 2 max pool (ceil mode); four stages of [3, 8, 36, 3] SE bottlenecks with 64
    groups and SE reduction 16; shortcut projections of 1x1 in the first stage and 3x3 / 2
    after; global average pool (an adaptive pool: the legacy model's 7 x 7 average pool at
    224), dropout 0.2, fc. ``groups=1`` makes the 3x3 convolutions dense (as G10's listing
    has them)."""

    def __init__(self, layers=(3, 8, 36, 3), groups: int = 64, reduction: int = 16,
                 classes: int = CLASSES, dropout: float = 0.2):
        super().__init__()
        self.layer0 = nn.Sequential()
        for i, (cin, cout, stride) in enumerate(((3, 64, 2), (64, 64, 1), (64, 128, 1)), 1):
            self.layer0.add_module(f"conv{i}", nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False))
            self.layer0.add_module(f"bn{i}", nn.BatchNorm2d(cout))
            self.layer0.add_module(f"relu{i}", nn.ReLU(inplace=True))
        self.layer0.add_module("pool", nn.MaxPool2d(3, stride=2, ceil_mode=True))
        inplanes = 128
        for i, count in enumerate(layers):
            planes = 64 * 2**i
            stride = 1 if i == 0 else 2
            kernel, padding = (1, 0) if i == 0 else (3, 1)
            out = planes * SEBottleneck.expansion
            downsample = None
            if stride != 1 or inplanes != out:
                downsample = nn.Sequential(nn.Conv2d(inplanes, out, kernel, stride=stride, padding=padding,
                                                     bias=False), nn.BatchNorm2d(out))
            blocks = [SEBottleneck(inplanes, planes, groups, reduction, stride, downsample)]
            inplanes = out
            blocks += [SEBottleneck(inplanes, planes, groups, reduction) for _ in range(1, count)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.last_linear = nn.Linear(inplanes, classes)

    def forward(self, x):
        x = self.layer4(self.layer3(self.layer2(self.layer1(self.layer0(x)))))
        return self.last_linear(self.dropout(torch.flatten(self.avg_pool(x), 1)))


def senet154(batch: int = 1024, seq: int = 224):
    """SENet-154 as published (64-group 3x3 convolutions), images ``seq`` x ``seq``."""
    with torch.device("meta"):
        net = SENet154()
    images, labels = _image_batch(batch, seq)
    return net, (images,), F.cross_entropy, (labels,)


def senet154_dense(batch: int = 1024, seq: int = 224):
    """SENet-154 with dense (ungrouped) 3x3 convolutions, as G10's model listing prints it."""
    with torch.device("meta"):
        net = SENet154(groups=1)
    images, labels = _image_batch(batch, seq)
    return net, (images,), F.cross_entropy, (labels,)


# ----------------------------------------------------------------------------- G10's transformers


def vit_g10(batch: int = 1280, seq: int = 224):
    """G10's VIT: 12 layers, hidden 384, 6 heads, MLP 1536, patch 32 (ViT-S/32), no dropout,
    images ``seq`` x ``seq`` (a multiple of 32). The registered ``vit-base`` is ViT-B/16."""
    from tracer.models import ViT
    if seq % 32:
        raise ValueError(f"the image side must be a multiple of the patch (32), got {seq}")
    with torch.device("meta"):
        net = ViT(side=seq, patch=32, dim=384, depth=12, heads=6, mlp=1536)
    images, labels = _image_batch(batch, seq)
    return net, (images,), F.cross_entropy, (labels,)


def bert_base_g10(batch: int = 256, seq: int = 128):
    """G10's BERT_Base: the BERT-base encoder with its pooler at sequence length ``seq``
    (128 by default), no dropout (G10's graph has none), trained through a 2-class
    classifier on the pooled output (HF BertForSequenceClassification, SDPA attention)."""
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import BertConfig, BertForSequenceClassification
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        config = BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                            classifier_dropout=0.0, num_labels=2, use_cache=False,
                            attn_implementation="sdpa")
        with torch.device("meta"):
            net = BertForSequenceClassification(config)
    finally:
        hf_logging.set_verbosity(level)
    ids = torch.empty(batch, seq, dtype=torch.int64, device="meta")
    labels = torch.empty(batch, dtype=torch.int64, device="meta")
    return net, {"input_ids": ids}, lambda out, y: F.cross_entropy(out.logits, y), (labels,)
