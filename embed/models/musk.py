"""MUSK's image encoder (Xiang et al., Nature 2025; weights ``xiangjx/musk``, code
github.com/lilab-stanford/MUSK), written from the authors' code so that their checkpoint's
image half loads into it strictly; no ``musk`` or ``torchscale`` package is imported.

MUSK is a BEiT-3 multiway transformer (the copy of torchscale's ``BEiT3`` in the authors'
package): each of its 24 layers holds one set of attention and feed-forward weights per
modality, ``A`` for vision and ``B`` for language (``MultiwayNetwork``), and an image runs
through the ``A`` experts alone (``multiway_split_position = -1``). That path is a pre-norm
ViT-L/16 at 384 px with torchscale's sub-LayerNorm (``subln``, its config's default): a
LayerNorm on the attention's output before its projection (``inner_attn_ln``) and one on the
feed-forward's hidden units after GELU (``ffn_layernorm``); LayerNorm eps 1e-5, no layer
scale, no relative position bias, the class token after the final LayerNorm. timm's ViT
``Block`` with ``scale_attn_norm`` and ``scale_mlp_norm`` is that layer exactly (its ``attn.norm``
and ``mlp.norm``), so the backbone here is timm's ViT-L/16 and `musk_state` renames the
authors' tensors onto it.

The tile's features are what the authors' README runs for linear probes and MIL,
``model(image=x, with_head=False, out_norm=False, ms_aug=True, return_global=True)[0]``
(``musk.utils.MultiScaleForward``): the class token of the tile, then the mean class token of
the tile upsampled (bicubic) to twice its side and cut into four tiles of the model's size,
concatenated (2,048-d). Upsampling to the same side is the identity, so the first half is the
class token of the tile itself: TRIDENT's ``musk`` (``ms_aug`` off by default) is those 1,024.
"""

from __future__ import annotations

import functools
import re

import timm
import torch
import torch.nn.functional as F
from torch import nn

from tilestore.errors import ModelError

State = dict[str, torch.Tensor]

# the authors' ``musk_large_patch16_384`` (``_get_large_config``, torchscale's EncoderConfig)
MUSK_LARGE = {
    "img_size": 384,
    "patch_size": 16,
    "embed_dim": 1024,
    "depth": 24,
    "num_heads": 16,
    "mlp_ratio": 4.0,
    "qkv_bias": True,
    "scale_attn_norm": True,
    "scale_mlp_norm": True,
    "norm_layer": functools.partial(nn.LayerNorm, eps=1e-5),
}
# the scales of ``MultiScaleForward`` (its default, as the README runs it)
SCALES = (1, 2)
# fairseq's offset: the position of the first token is 2, rows 0 and 1 are never read
POSITION_OFFSET = 2

# the checkpoint's tensors the image features do not use: the language experts (``.B.``),
# the token embedding, the text projection and the temperature (text), the image projection
# (zero-shot only: ``with_head``) and the mask token (masked-image pretraining)
_UNUSED = re.compile(
    r"(\.B\.|^beit3\.text_embed\.|^language_head\.|^logit_scale$|^vision_head\.|"
    r"^beit3\.vision_embed\.mask_token$)"
)
# per layer: the authors' vision expert -> timm's Block (the rest of the key after the prefix)
_LAYER = {
    "self_attn_layer_norm.A.": "norm1.",
    "self_attn.inner_attn_ln.A.": "attn.norm.",
    "self_attn.out_proj.A.": "attn.proj.",
    "final_layer_norm.A.": "norm2.",
    "ffn.A.fc1.": "mlp.fc1.",
    "ffn.A.ffn_layernorm.": "mlp.norm.",
    "ffn.A.fc2.": "mlp.fc2.",
}
_TOP = {
    "beit3.vision_embed.cls_token": "cls_token",
    "beit3.vision_embed.proj.": "patch_embed.proj.",
    "beit3.encoder.layer_norm.A.": "norm.",
}


class MuskImage(nn.Module):
    """MUSK's vision path: ``forward_features`` gives (n, len(scales) + patches, 1024): the
    class token of each scale (of the tile; the mean over the tile's crops at a larger
    scale), then the tile's patch tokens, all after the final LayerNorm."""

    def __init__(self, scales: tuple[int, ...] = SCALES, **kwargs: object):
        super().__init__()
        if not scales or scales[0] != 1:
            raise ValueError(f"scales={scales}: the first scale is the tile's own (1)")
        self.vit = timm.create_model(
            "vit_large_patch16_384", pretrained=False, num_classes=0, global_pool="",
            **{**MUSK_LARGE, **kwargs},
        )  # fmt: skip
        self.scales = tuple(scales)
        self.num_prefix_tokens = len(self.scales)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.vit.forward_features(x)
        classes = [tokens[:, :1]] + [self._class_at(x, scale) for scale in self.scales[1:]]
        return torch.cat([*classes, tokens[:, 1:]], dim=1)

    def _class_at(self, x: torch.Tensor, scale: int) -> torch.Tensor:
        """The mean class token of x resized (bicubic, in float32 as the authors do) to
        `scale` times its side and cut into crops of its side (n, 1, dim)."""
        n, channels, side, _ = x.shape
        big = F.interpolate(x.float(), size=side * scale, mode="bicubic").to(x.dtype)
        splits = scale  # crops of the tile's side (their max_split_size, by default)
        # crops ordered row of crops, column of crops, tile: the authors' chessboard split
        crops = (
            big.reshape(n, channels, splits, side, splits, side)
            .permute(2, 4, 0, 1, 3, 5)
            .reshape(splits * splits * n, channels, side, side)
        )
        classes = self.vit.forward_features(crops)[:, 0]
        return classes.reshape(splits * splits, n, -1).mean(0)[:, None]


def musk(**kwargs: object) -> MuskImage:
    return MuskImage(**kwargs)


def _renamed(rest: str, table: dict[str, str], prefix: str, key: str) -> str:
    """`prefix` and the table's name for the start of `rest`; `key` where none matches."""
    return next((prefix + v + rest[len(k) :] for k, v in table.items() if rest.startswith(k)), key)


def musk_state(state: State) -> State:
    """The authors' whole MUSK state (``beit3.*``, the heads, ``logit_scale``; their
    loader strips no prefix) as our module names it: the vision experts (``.A.``) renamed
    onto timm's ViT under ``vit.``, each layer's query, key and value stacked into ``qkv``,
    the position table without its two unread rows; the tensors `_UNUSED` names dropped. A
    key neither names is kept as it is (and fails the strict load)."""
    out: State = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        if _UNUSED.search(key):
            continue
        layer = re.match(r"^beit3\.encoder\.layers\.(\d+)\.(.*)$", key)
        if key == "beit3.encoder.embed_positions.A.weight":
            out["vit.pos_embed"] = value[POSITION_OFFSET:].unsqueeze(0)
        elif layer:
            index, rest = layer.groups()
            part = re.match(r"^self_attn\.([qkv])_proj\.A\.(weight|bias)$", rest)
            if part:
                qkv.setdefault(f"vit.blocks.{index}.attn.qkv.{part[2]}", {})[part[1]] = value
                continue
            out[_renamed(rest, _LAYER, f"vit.blocks.{index}.", key)] = value
        else:
            out[_renamed(key, _TOP, "vit.", key)] = value
    for key, parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise ModelError(f"MUSK's checkpoint has {sorted(parts)} of q, k, v for {key}")
        out[key] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return out
