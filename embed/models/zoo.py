"""Encoders whose code ships only in their authors' repositories, built from timm and torch
blocks so that the authors' published state dicts load into them strictly.

- CTransPath (and CHIEF's CTransPath): timm's Swin-T whose patch embedding is the authors'
  convolutional stem (two stride-2 3x3 convolutions with batch norm, then a 1x1).
- CONCH v1: a ViT-B/16 trunk at 448 px, then an attentional pooler (one query, torch's
  multi-head attention) and a layer norm: CONCH's ``encode_image(proj_contrast=False)``.
- CONCH v1.5 (TITAN's tile encoder): a ViT-L/16 trunk with layer scale, then its attentional
  pooler (one query, separate q and kv projections) and a layer norm. Its position table is
  published for 224 px (14 x 14) and the authors' forward interpolates it to the 448 px
  input at every call; here that interpolation is done once, when the weights are loaded,
  with the same call (bicubic, the same scale factor), so the numbers are the same.
- iSight (IHC): transformers' CLIP ViT-L/14 vision tower at 336 px, fine-tuned, then the
  linear map its authors apply to every final token (``visual_token_projection``; their
  ``CLAM_ViT``, zhihuanglab/iSight ``model/patch_encoder_with_clam.py``). The tokens are the
  tower's last hidden states, before its post-norm (``hidden_states[-1]``): its post-norm and
  CLIP's projection were not trained by them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from tilestore.errors import ModelError

State = dict[str, torch.Tensor]


# -- CTransPath --------------------------------------------------------------------------------


class ConvStem(nn.Module):
    """CTransPath's patch embedding, giving timm's Swin the NHWC grid it expects."""

    def __init__(
        self,
        img_size=224,
        patch_size=4,
        in_chans=3,
        embed_dim=96,
        norm_layer=None,
        output_fmt="NHWC",
        **_: object,
    ):
        super().__init__()
        if patch_size != 4 or embed_dim % 8:
            raise ValueError("CTransPath's stem takes patch_size 4 and embed_dim divisible by 8")
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.patch_size = (patch_size, patch_size)
        self.grid_size = (self.img_size[0] // patch_size, self.img_size[1] // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        width, layers = embed_dim // 8, []
        for _ in range(2):
            layers += [
                nn.Conv2d(in_chans, width, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
            ]
            in_chans, width = width, width * 2
        layers.append(nn.Conv2d(in_chans, embed_dim, 1))
        self.proj = nn.Sequential(*layers)
        self.norm = norm_layer(embed_dim) if norm_layer else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


def ctranspath(img_size: int = 224) -> nn.Module:
    """Swin-T (window 7, depths 2-2-6-2, 96 wide) with CTransPath's stem, headless."""
    return SwinTransformer(
        img_size=img_size,
        patch_size=4,
        window_size=7,
        embed_dim=96,
        depths=(2, 2, 6, 2),
        num_heads=(3, 6, 12, 24),
        embed_layer=ConvStem,
        num_classes=0,
    )


# -- iSight -----------------------------------------------------------------------------------

# openai/clip-vit-large-patch14-336's vision tower, the base its authors fine-tuned
ISIGHT_CLIP = {
    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
    "num_attention_heads": 16, "image_size": 336, "patch_size": 14,
    "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "projection_dim": 768,
}  # fmt: skip


class ISight(nn.Module):
    """iSight's tile tokens: CLIP's final hidden states, each through the authors' linear
    map. Attribute names are theirs (``patch_encoder``: a CLIP whose vision tower is kept)."""

    def __init__(self, **overrides: object):
        super().__init__()
        from transformers import CLIPVisionConfig, CLIPVisionModel

        config = CLIPVisionConfig(**{**ISIGHT_CLIP, **overrides})
        config._attn_implementation = "sdpa"
        tower = CLIPVisionModel(config)  # transformers 5 flattened it; 4 nests vision_model
        self.patch_encoder = nn.Module()
        self.patch_encoder.vision_model = getattr(tower, "vision_model", tower)
        self.visual_token_projection = nn.Linear(config.hidden_size, config.hidden_size)
        self.num_prefix_tokens = 1

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.patch_encoder.vision_model(pixel_values=x).last_hidden_state
        return self.visual_token_projection(hidden)


def isight_state(state: State) -> State:
    """The vision tower and the token map out of the authors' whole ``CLAM_ViT`` state
    (``model_state_dict``: CLIP's text tower, the attention pooler and the task heads too);
    CLIP's position ids, a buffer older transformers saved, are computed here."""
    keep = ("patch_encoder.vision_model.", "visual_token_projection.")
    return {k: v for k, v in state.items() if k.startswith(keep) and not k.endswith("position_ids")}


# -- CONCH ----------------------------------------------------------------------------------


class TorchAttentionPool(nn.Module):
    """CONCH v1's pooler: learned queries attending to the tokens (torch's attention)."""

    def __init__(self, dim: int, context: int, heads: int = 8, queries: int = 1):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(queries, dim))
        self.attn = nn.MultiheadAttention(dim, heads, kdim=context, vdim=context, batch_first=True)
        self.ln_q = nn.LayerNorm(dim)
        self.ln_k = nn.LayerNorm(context)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        keys = self.ln_k(tokens)
        query = self.ln_q(self.query).expand(tokens.shape[0], -1, -1)
        return self.attn(query, keys, keys, need_weights=False)[0]


class ProjectedAttentionPool(nn.Module):
    """CONCH v1.5's pooler: learned queries, separate q and kv projections, no biases."""

    def __init__(self, dim: int, context: int, heads: int = 8, queries: int = 1):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(queries, dim))
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.ln_k = nn.LayerNorm(context)
        self.ln_q = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_kv = nn.Linear(context, dim * 2, bias=False)
        self.to_out = nn.Linear(dim, dim, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n, h = tokens.shape[0], self.heads
        q = self.to_q(self.ln_q(self.query)).expand(n, -1, -1)
        k, v = self.to_kv(self.ln_k(tokens)).chunk(2, dim=-1)
        q, k, v = (t.unflatten(-1, (h, -1)).transpose(1, 2) for t in (q, k, v))
        sim = (q * self.scale) @ k.transpose(-1, -2)
        attn = (sim - sim.amax(dim=-1, keepdim=True).detach()).softmax(dim=-1)
        return self.to_out((attn @ v).transpose(1, 2).flatten(2))


class Conch(nn.Module):
    """A CONCH vision tower: trunk tokens, then ``pool`` (pooler, layer norm), and where
    ``projection`` is set, ``project`` (the contrastive projection)."""

    def __init__(self, trunk: VisionTransformer, pooler: nn.Module, dim: int, projection: bool):
        super().__init__()
        self.trunk = trunk
        self.attn_pool_contrast = pooler
        self.ln_contrast = nn.LayerNorm(dim)
        self.proj_contrast = nn.Parameter(torch.zeros(dim, dim)) if projection else None
        self.num_prefix_tokens = trunk.num_prefix_tokens

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.trunk.forward_features(x)

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.ln_contrast(self.attn_pool_contrast(tokens)[:, 0])

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled @ self.proj_contrast


def conch(variant: str, img_size: int = 448, projection: bool = False) -> Conch:
    if variant == "v1":
        trunk = VisionTransformer(
            img_size=img_size, patch_size=16, embed_dim=768, depth=12, num_heads=12,
            num_classes=0, global_pool="",
        )  # fmt: skip
        return Conch(trunk, TorchAttentionPool(512, 768), 512, projection)
    if variant == "v1.5":
        trunk = VisionTransformer(
            img_size=img_size, patch_size=16, embed_dim=1024, depth=24, num_heads=16,
            init_values=1.0, num_classes=0, global_pool="",
        )  # fmt: skip
        return Conch(trunk, ProjectedAttentionPool(768, 1024), 768, projection)
    raise ModelError(f"CONCH has no variant {variant!r} (v1, v1.5)")


def conch_state(variant: str, state: State, model: Conch) -> State:
    """The published vision weights in our module's keys.

    v1: the whole CoCa checkpoint; the vision tower's ``visual.`` keys are kept, without the
    captioning pooler (the text decoder's input) and, unless asked, the projection.
    v1.5: ``pytorch_model_vision.bin``; its 14 x 14 position table interpolated to the
    trunk's grid as the authors' forward does it."""
    if variant == "v1":
        keep = ("trunk.", "attn_pool_contrast.", "ln_contrast.")
        keep += ("proj_contrast",) if model.proj_contrast is not None else ()
        state = {k.removeprefix("visual."): v for k, v in state.items() if k.startswith("visual.")}
        return {k: v for k, v in state.items() if k.startswith(keep)}
    state = dict(state)
    if model.proj_contrast is None:
        state.pop("proj_contrast", None)
    if "trunk.pos_embed" in state:
        state["trunk.pos_embed"] = _authors_pos_embed(state["trunk.pos_embed"], model.trunk)
    return state


def _authors_pos_embed(table: torch.Tensor, trunk: VisionTransformer) -> torch.Tensor:
    """CONCH v1.5's position table as its authors' forward uses it at the trunk's input size:
    first resampled to the 224 px grid they build (bilinear, no antialiasing), then
    interpolated bicubically with the scale factor (grid + 0.1) / 14."""
    base = 14
    if table.shape[1] - 1 != base * base:
        table = resample_abs_pos_embed(
            table, new_size=(base, base), num_prefix_tokens=1, interpolation="bilinear",
            antialias=False, verbose=False,
        )  # fmt: skip
    rows, cols = trunk.patch_embed.grid_size
    if (rows, cols) == (base, base):
        return table
    dim = table.shape[-1]
    grid = table[:, 1:].reshape(1, base, base, dim).permute(0, 3, 1, 2)
    scale = ((rows + 0.1) / math.sqrt(base * base), (cols + 0.1) / math.sqrt(base * base))
    grid = F.interpolate(grid.float(), scale_factor=scale, mode="bicubic").to(table.dtype)
    if grid.shape[-2:] != (rows, cols):
        raise ModelError(f"CONCH v1.5: position table came out {tuple(grid.shape[-2:])}")
    return torch.cat([table[:, :1], grid.permute(0, 2, 3, 1).reshape(1, rows * cols, dim)], 1)


# -- CONCH's text tower -------------------------------------------------------------------------


class _TextBlock(nn.Module):
    """One pre-norm block of CONCH's text transformer (torch's attention, sequence first)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential()
        self.mlp.add_module("c_fc", nn.Linear(width, width * 4))
        self.mlp.add_module("gelu", nn.GELU())
        self.mlp.add_module("c_proj", nn.Linear(width * 4, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False, attn_mask=mask)[0]
        return x + self.mlp(self.ln_2(x))


class _TextBlocks(nn.Module):
    def __init__(self, width: int, heads: int, layers: int):
        super().__init__()
        self.resblocks = nn.ModuleList(_TextBlock(width, heads) for _ in range(layers))


class ConchText(nn.Module):
    """CONCH v1's text encoder (its CoCa ``text`` tower): token and position embeddings, a
    class embedding appended after the tokens, causal attention in which the class token
    sees the tokens that are not padding, then the class token's final norm and the
    projection. Takes the 127 token ids CONCH's ``tokenize`` gives before its placeholder
    (``encode_text`` drops that last one); returns the (n, 512) text embedding, unnormalised."""

    def __init__(self, vocab: int = 32007, context: int = 128, width: int = 768, heads: int = 12,
                 layers: int = 12, dim: int = 512, pad_id: int = 0):  # fmt: skip
        super().__init__()
        self.heads, self.pad_id = heads, pad_id
        self.token_embedding = nn.Embedding(vocab, width)
        self.positional_embedding = nn.Parameter(torch.zeros(context, width))
        self.cls_emb = nn.Parameter(torch.zeros(width))
        self.transformer = _TextBlocks(width, heads, layers)
        self.ln_final = nn.LayerNorm(width)
        self.text_projection = nn.Parameter(torch.zeros(width, dim))
        causal = torch.full((context, context), float("-inf")).triu_(1)
        self.register_buffer("attn_mask", causal, persistent=False)

    def _mask(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The causal mask plus the class token's: as CoCa builds it, the class row's key j
        is open where token j - 1 is not padding (and key 0 always), one mask per head."""
        n, length = ids.shape[0], ids.shape[1] + 1
        seen = F.pad((ids != self.pad_id).unsqueeze(1), (1, 0, length - 1, 0), value=True)
        extra = torch.zeros(seen.shape, dtype=dtype, device=ids.device)
        extra.masked_fill_(~seen, float("-inf"))
        mask = self.attn_mask[None, :length, :length].to(dtype) + extra
        return mask.repeat_interleave(self.heads, 0).reshape(n * self.heads, length, length)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.token_embedding(ids)
        x = torch.cat([x, self.cls_emb.view(1, 1, -1).expand(x.shape[0], 1, -1)], dim=1)
        mask = self._mask(ids, x.dtype)
        x = (x + self.positional_embedding[: x.shape[1]]).permute(1, 0, 2)
        for block in self.transformer.resblocks:
            x = block(x, mask)
        return self.ln_final(x[-1]) @ self.text_projection
