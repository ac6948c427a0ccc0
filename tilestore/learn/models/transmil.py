"""TransMIL: transformer-based correlated MIL (Shao et al., NeurIPS 2021, arXiv:2106.00908),
as STAMP trains it (KatherLab/STAMP `stamp.modeling.models.trans_mil`).

    h     = ReLU(Linear(in_dim, hidden)(x))          the tiles, projected
    h     = h + its first tiles again, to side^2     side = ceil(sqrt(N)): the bag as a square
    h     = [cls; h]                                  a learned class token in front
    h     = h + Nystrom(LayerNorm(h))                 layer 1: approximate self-attention
    h     = PPEG(h)                                   depthwise convolutions 7, 5, 3 on the square
    h     = h + Nystrom(LayerNorm(h))                 layer 2
    logit = Linear(LayerNorm(h)[cls])

Nystrom attention (Xiong et al., AAAI 2021, arXiv:2102.03902) approximates softmax(QK^T)V
with `landmarks` means of consecutive queries and keys: softmax(Q Kl^T) pinv(softmax(Ql Kl^T))
softmax(Ql K^T) V, the pseudo-inverse by 6 Newton-Schulz iterations, plus a depthwise
convolution of V along the sequence (the "residual"). The sequence is padded in front with
zeros to a multiple of `landmarks`.

TransMIL is not permutation invariant by design: the square of tiles and its convolutions
see the order of the tiles, and the landmarks group consecutive tiles. It is not padding
invariant either (both depend on N): so each bag of a batch runs at its own length, its real
tiles only, in their order, and a padded bag gives exactly the bag's logits. Bags of one
length run together, as one batch (the pseudo-inverse's scale taken per bag, as a bag alone
would have it): bags sampled to `max_tiles`, or of equal size, cost one pass. No attention
is returned (the Nystrom product is not a distribution over tiles); tile scores are a
gradient x input attribution.

`from_reference("stamp", state_dict)` takes the weights of STAMP's `TransMIL`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tilestore.learn.models.base import (
    BagOutput,
    Dropout,
    Hidden,
    InDim,
    Outputs,
    full_mask,
    gradient_x_input,
)
from tilestore.options import checked


class NystromAttention(nn.Module):
    """Multi-head Nystrom self-attention over one sequence (B, n, dim), no padding."""

    def __init__(
        self,
        dim: int,
        *,
        heads: int = 8,
        landmarks: int = 256,
        pinv_iterations: int = 6,
        kernel: int = 33,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.heads, self.landmarks, self.iterations = heads, landmarks, pinv_iterations
        self.head_dim = dim // heads
        inner = heads * self.head_dim
        self.qkv = nn.Linear(dim, 3 * inner, bias=False)
        self.out = nn.Linear(inner, dim)
        self.dropout = nn.Dropout(dropout)
        # a depthwise convolution of each head's values along the sequence
        self.residual = nn.Conv2d(
            heads, heads, (kernel, 1), padding=(kernel // 2, 0), groups=heads, bias=False
        )

    def forward(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        m = self.landmarks
        x = F.pad(x, (0, 0, (-n) % m, 0))  # zeros in front: m segments of equal length
        q, k, v = (
            t.reshape(b, -1, self.heads, self.head_dim).transpose(1, 2)
            for t in self.qkv(x).chunk(3, dim=-1)
        )  # each (b, heads, n', head_dim)
        q = q * self.head_dim**-0.5
        segment = q.shape[2] // m
        q_land = q.reshape(b, self.heads, m, segment, -1).sum(dim=3) / segment
        k_land = k.reshape(b, self.heads, m, segment, -1).sum(dim=3) / segment
        kernel1 = torch.softmax(q @ k_land.transpose(-1, -2), dim=-1)
        kernel2 = torch.softmax(q_land @ k_land.transpose(-1, -2), dim=-1)
        kernel3 = torch.softmax(q_land @ k.transpose(-1, -2), dim=-1)
        out = (kernel1 @ pseudo_inverse(kernel2, self.iterations)) @ (kernel3 @ v)
        out = out + self.residual(v)
        out = out.transpose(1, 2).reshape(b, -1, self.heads * self.head_dim)
        return self.dropout(self.out(out))[:, -n:]


def pseudo_inverse(a: Tensor, iterations: int) -> Tensor:
    """The Moore-Penrose pseudo-inverse of each (b, heads, m, m) matrix by Newton-Schulz
    iterations (Razavi et al. 2014), started from a^T / (max row sum * max column sum), the
    maxima over each bag's heads (one bag: the whole tensor's, as STAMP takes them)."""
    eye = torch.eye(a.shape[-1], device=a.device, dtype=a.dtype)
    rows = a.abs().sum(dim=-1).amax(dim=(-2, -1), keepdim=True)[..., None]
    columns = a.abs().sum(dim=-2).amax(dim=(-2, -1), keepdim=True)[..., None]
    z = a.transpose(-1, -2) / (rows * columns)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


class Layer(nn.Module):
    """x + Nystrom(LayerNorm(x))."""

    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attention = NystromAttention(dim, landmarks=dim // 2, dropout=dropout)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.attention(self.norm(x))


class PPEG(nn.Module):
    """Pyramid position encoding: the tiles laid on a square, plus three depthwise
    convolutions of it (7x7, 5x5, 3x3); the class token passes by."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv7 = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.conv5 = nn.Conv2d(dim, dim, 5, padding=2, groups=dim)
        self.conv3 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: Tensor, side: int) -> Tensor:
        b, _, c = x.shape
        square = x[:, 1:].transpose(1, 2).reshape(b, c, side, side)
        square = square + self.conv7(square) + self.conv5(square) + self.conv3(square)
        return torch.cat([x[:, :1], square.flatten(2).transpose(1, 2)], dim=1)


class TransMIL(nn.Module):
    """TransMIL over bags (B, N, D); each bag runs at its own length (see the module)."""

    @checked
    def __init__(
        self, in_dim: InDim, outputs: Outputs, *, hidden: Hidden = 512, dropout: Dropout = 0.1
    ) -> None:
        super().__init__()
        self.fc1 = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU())
        self.cls_token = nn.Parameter(torch.randn(1, 1, hidden))
        self.layer1 = Layer(hidden, dropout)
        self.ppeg = PPEG(hidden)
        self.layer2 = Layer(hidden, dropout)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, outputs)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> BagOutput:
        mask = full_mask(x, mask)
        counts = mask.sum(dim=1).tolist()
        order, parts = [], []
        for n in sorted(set(counts)):  # the bags of each length together, real tiles only
            same = [b for b, c in enumerate(counts) if c == n]
            parts.append(self._bags(torch.stack([x[b][mask[b]] for b in same])))
            order += same
        logits = torch.cat(parts)[torch.argsort(torch.as_tensor(order, device=x.device))]
        return BagOutput(logits)

    def _bags(self, x: Tensor) -> Tensor:
        """The logits (B, outputs) of bags (B, n, D) of n real tiles each."""
        h = self.fc1(x)
        n = h.shape[1]
        side = math.ceil(math.sqrt(n))
        h = torch.cat([h, h[:, : side * side - n]], dim=1)
        h = torch.cat([self.cls_token.to(h.dtype).expand(h.shape[0], -1, -1), h], dim=1)
        h = self.layer2(self.ppeg(self.layer1(h), side))
        return self.head(self.norm(h)[:, 0])

    def tile_scores(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Gradient x input per tile and output (B, N, outputs)."""
        return gradient_x_input(self, x, mask)


_STAMP_NAMES = {
    "_fc1.": "fc1.",
    "cls_token": "cls_token",
    "pos_layer.proj.": "ppeg.conv7.",
    "pos_layer.proj1.": "ppeg.conv5.",
    "pos_layer.proj2.": "ppeg.conv3.",
    "norm.": "norm.",
    "_fc2.": "head.",
}
_STAMP_LAYER = {
    "norm.": "norm.",
    "attn.to_qkv.": "attention.qkv.",
    "attn.to_out.0.": "attention.out.",
    "attn.res_conv.": "attention.residual.",
}


def from_reference(name: str, state_dict: Mapping[str, Tensor]) -> TransMIL:
    """Our TransMIL holding the weights of STAMP's `TransMIL` (name "stamp")."""
    if name != "stamp":
        raise ValueError(f"no TransMIL reference {name!r}: known is stamp")
    names = dict(_STAMP_NAMES)
    for layer in ("layer1.", "layer2."):
        names |= {layer + theirs: layer + ours for theirs, ours in _STAMP_LAYER.items()}
    ours = {}
    for key, value in state_dict.items():
        # the longest prefix first: "pos_layer.proj1." before "pos_layer.proj."
        prefix = max((p for p in names if key.startswith(p)), key=len, default=None)
        if prefix is None:
            raise ValueError(f"reference weight {key!r}: no counterpart in ours")
        ours[names[prefix] + key[len(prefix) :]] = value
    hidden, in_dim = ours["fc1.0.weight"].shape
    model = TransMIL(in_dim, ours["head.weight"].shape[0], hidden=hidden)
    model.load_state_dict(ours)
    return model
