"""GenBio-PathFM's encoder, written from its authors' description and the copy of their code in
TRIDENT (``trident/patch_encoder_models/model_zoo/genbio_pathfm``), so that their published
``model.pth`` loads into it strictly under the same key names.

A DINOv3-style ViT-G/16 (1536 wide, 40 blocks, 24 heads): a class token and four storage
tokens before the patches, rotary position encoding on the patch tokens only (no position
table), SwiGLU feed-forward (its hidden width rounded up to a multiple of 64), layer scale.
It reads one colour channel at a time: an RGB tile is three single-channel images, each
encoded on its own, and the three final token sequences are laid side by side (the feature
width triples: 4,608). The class token of that sequence is the authors' output (their
``forward``: the three channels' class tokens concatenated, R, G, B); its patch tokens are
their ``forward_with_patches``.

The rotary angles are computed in bfloat16 whatever the model's precision, and the queries
and keys are rotated in bfloat16, as the authors do (``pos_embed_rope_dtype="bf16"``): in
float32 the model is not float32 throughout, by their design.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# the authors' configuration of the released model (their ``GenBioPathFMInference``)
GENBIO_PATHFM = {"embed_dim": 1536, "depth": 40, "num_heads": 24, "ffn_ratio": 4.0}
ROPE_DTYPE = torch.bfloat16
CHANNELS = 3


class Rope(nn.Module):
    """Sine and cosine of the rotary angles of an h x w patch grid: coordinates in [-1, 1]
    per axis (each axis normalised by its own length), periods base ** (2 i / (d / 2))."""

    def __init__(self, dim: int, heads: int, base: float = 100.0):
        super().__init__()
        head = dim // heads
        exponents = 2 * torch.arange(head // 4, dtype=torch.float32) / (head // 2)
        self.register_buffer("periods", (base**exponents).to(ROPE_DTYPE), persistent=True)

    def forward(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        dd = {"device": self.periods.device, "dtype": ROPE_DTYPE}
        rows = torch.arange(0.5, h, **dd) / h
        cols = torch.arange(0.5, w, **dd) / w
        coords = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).flatten(0, 1)
        coords = 2.0 * coords - 1.0
        periods = self.periods.to(ROPE_DTYPE)
        angles = 2 * math.pi * coords[:, :, None] / periods[None, None, :]
        angles = angles.flatten(1, 2).tile(2)
        return torch.sin(angles), torch.cos(angles)


def _rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """The rotary transform of the last len(sin) tokens (the patches), in the angles' dtype;
    the prefix tokens are left as they are."""
    dtype, prefix = x.dtype, x.shape[-2] - sin.shape[-2]
    x = x.to(sin.dtype)
    first, second = x[..., prefix:, :].chunk(2, dim=-1)
    turned = x[..., prefix:, :] * cos + torch.cat([-second, first], dim=-1) * sin
    return torch.cat([x[..., :prefix, :], turned], dim=-2).to(dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        n, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(n, tokens, 3, self.heads, dim // self.heads)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        q, k = _rotate(q, *rope), _rotate(k, *rope)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(n, tokens, dim))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, ratio: float, align: int = 64):
        super().__init__()
        hidden = int(dim * ratio * 2 / 3)
        hidden += -hidden % align
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(dim, hidden)
        self.w3 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), 1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, ffn_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.ls1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = SwiGLU(dim, ffn_ratio)
        self.ls2 = LayerScale(dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), rope))
        return x + self.ls2(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    def __init__(self, dim: int, patch: int):
        super().__init__()
        self.patch_size = (patch, patch)
        self.proj = nn.Conv2d(1, dim, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class GenBioPathFM(nn.Module):
    """The per-channel encoder: ``forward_features`` gives (n, 5 + patches, 3 x width), the
    three channels' final (normalised) tokens side by side."""

    def __init__(
        self,
        embed_dim: int = 1536,
        depth: int = 40,
        num_heads: int = 24,
        ffn_ratio: float = 4.0,
        patch_size: int = 16,
        storage_tokens: int = 4,
    ):
        super().__init__()
        self.patch_embed = PatchEmbed(embed_dim, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.storage_tokens = nn.Parameter(torch.zeros(1, storage_tokens, embed_dim))
        self.rope_embed = Rope(embed_dim, num_heads)
        self.blocks = nn.ModuleList(Block(embed_dim, num_heads, ffn_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.num_prefix_tokens = 1 + storage_tokens

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Final tokens of single-channel images (n, 1, h, w): class, storage, patches."""
        grid = self.patch_embed(x)
        h, w = grid.shape[-2:]
        patches = grid.flatten(2).transpose(1, 2)
        n = patches.shape[0]
        tokens = torch.cat(
            [self.cls_token.expand(n, -1, -1), self.storage_tokens.expand(n, -1, -1), patches],
            dim=1,
        )
        rope = self.rope_embed(h, w)
        for block in self.blocks:
            tokens = block(tokens, rope)
        return self.norm(tokens)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        n, channels, h, w = x.shape
        if channels != CHANNELS:
            raise ValueError(f"GenBio-PathFM reads RGB tiles, not {channels} channels")
        tokens = self.encode(x.reshape(n * channels, 1, h, w))
        return tokens.unflatten(0, (n, channels)).permute(0, 2, 1, 3).flatten(2)


def genbio_pathfm(**kwargs) -> GenBioPathFM:
    return GenBioPathFM(**{**GENBIO_PATHFM, **kwargs})
