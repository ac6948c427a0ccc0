"""MOOZY (AtlasAnalyticsLab/MOOZY): a slide encoder and the case transformer that makes one
patient's vector of that patient's slide vectors.

The slide encoder reads Lunit's ViT-S/8 tile features (384-d) on their grid: a linear
layer and GELU widen each tile to 768, a class token and 4 register tokens go in front,
6 pre-norm transformer blocks whose attention is biased by -slope x the Euclidean distance
between two tiles' cells (2-D ALiBi, a fixed slope per head; nothing to or from the class
and register tokens), a final layer norm; the class token is the 768-d slide vector (the
authors' ``MOOZYSlideEncoder`` as its stage-2 model calls it per slide). The authors build
the whole (heads x n x n) bias at once; here each chunk of query rows makes its own
(`attention.chunked_attention`): memory in n, not n^2.

The case transformer (``CaseAggregator``) puts a case token before the patient's slide
vectors, 3 pre-norm blocks with LayerScale on both residual branches and no positions (the
slides' order does not matter), a final layer norm: the case token is the 768-d patient
vector.

Parameter names follow the authors' checkpoint (``moozy.pt``: ``teacher_slide_encoder``
and ``case_transformer`` state dicts); its mask token, used only in pretraining, is kept so
that the checkpoint loads strictly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tilestore.embed.slides.nets.attention import CHUNK_BYTES, chunked_attention
from tilestore.embed.slides.nets.titan import alibi_slopes


class _Block(nn.Module):
    """A pre-norm transformer block with separate q, k, v projections; layer_scale: a
    learned scale on both residual branches (the case transformer's; the slide encoder's
    blocks have none)."""

    def __init__(self, dim: int, heads: int, hidden: int, layer_scale: bool) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q_proj, self.k_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.v_proj, self.out_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        if layer_scale:
            self.ls_attn, self.ls_mlp = _LayerScale(dim), _LayerScale(dim)
        else:
            self.ls_attn = self.ls_mlp = nn.Identity()

    def forward(self, x: torch.Tensor, bias=None, budget: int = CHUNK_BYTES) -> torch.Tensor:
        """(n, dim) tokens; bias(start, stop): the (heads, rows, n) bias of those query rows."""
        n, dim = x.shape
        y = self.norm1(x)

        def heads(proj: nn.Linear) -> torch.Tensor:
            return proj(y).view(n, self.heads, dim // self.heads).transpose(0, 1)

        out = chunked_attention(
            heads(self.q_proj), heads(self.k_proj), heads(self.v_proj), bias, budget
        )
        x = x + self.ls_attn(self.out_proj(out.transpose(0, 1).reshape(n, dim)))
        return x + self.ls_mlp(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


class _LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class MoozySlideEncoder(nn.Module):
    """Tile features on their grid -> the class token (see the module's docstring)."""

    def __init__(
        self,
        in_dim: int,
        dim: int,
        depth: int,
        heads: int,
        hidden: int,
        registers: int,
        budget: int,
    ) -> None:
        super().__init__()
        self.budget = budget
        self.input_proj = nn.Sequential(nn.Linear(in_dim, dim), nn.GELU())
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.register_tokens = nn.Parameter(torch.zeros(1, registers, dim)) if registers else None
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))  # pretraining's, unused here
        self.blocks = nn.ModuleList(_Block(dim, heads, hidden, False) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(heads)), persistent=False)

    def forward(self, features: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        x = self.input_proj(features)
        front = self.cls_token[0]
        if self.register_tokens is not None:
            front = torch.cat([front, self.register_tokens[0]])
        front = front.to(x.dtype)
        x = torch.cat([front, x])
        lead, n = len(front), len(x)
        where = cells.to(torch.float32)
        slopes = self.slopes.to(where.device).view(-1, 1, 1)

        def bias(start: int, stop: int) -> torch.Tensor:
            """-slope x distance between two tiles' cells; 0 to and from the class and
            register tokens (the first `lead` rows and columns)."""
            out = torch.zeros(len(slopes), stop - start, n, device=x.device, dtype=x.dtype)
            first = max(start, lead)
            if first < stop:
                rows = where[first - lead : stop - lead]
                dx = rows[:, :1] - where[:, 0]
                dy = rows[:, 1:] - where[:, 1]
                out[:, first - start :, lead:] = -slopes * torch.sqrt(dx * dx + dy * dy)
            return out

        for block in self.blocks:
            x = block(x, bias, self.budget)
        return self.norm(x[0])


class CaseAggregator(nn.Module):
    """A patient's slide vectors (slides, dim) -> its vector (dim,)."""

    def __init__(self, dim: int, depth: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.case_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.ModuleList(_Block(dim, heads, hidden, True) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, slides: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.case_token[0].to(slides.dtype), slides])
        for block in self.blocks:
            x = block(x)
        return self.norm(x[0])


class Moozy(nn.Module):
    """MOOZY's slide encoder (forward: one slide's vector) and its case transformer
    (`patient`: one patient's vector from its slides' vectors)."""

    grid = True

    def __init__(
        self,
        in_dim: int = 384,
        dim: int = 768,
        depth: int = 6,
        heads: int = 12,
        hidden: int = 3072,
        registers: int = 4,
        case_depth: int = 3,
        case_heads: int = 12,
        case_hidden: int = 3072,
        budget: int = CHUNK_BYTES,
    ) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.teacher_slide_encoder = MoozySlideEncoder(
            in_dim, dim, depth, heads, hidden, registers, budget
        )
        self.case_transformer = CaseAggregator(dim, case_depth, case_heads, case_hidden)

    def forward(self, features: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        """(n, in_dim) tile features and their (n, 2) grid cells -> (dim,)."""
        return self.teacher_slide_encoder(features, cells)

    def patient(self, slides: torch.Tensor) -> torch.Tensor:
        """(slides, dim) slide vectors of one patient -> (dim,)."""
        return self.case_transformer(slides)
