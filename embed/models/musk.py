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

Zero-shot (`MuskText`, `musk_text_state`) is the README's ``with_head=True, out_norm=True``:
text as XLM-R SentencePiece ids (their ``xlm_tokenizer``: 100 tokens, padded) through the
``B`` experts of the same 24 layers (their position table, the padded tokens zeroed and
never attended to), the final LayerNorm's ``B``, the class token through
``language_head``; the image is the tile's class token, the first 1,024 of the stored
features (``ms_aug`` off, as the README runs zero-shot), through ``vision_head``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import timm
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import Block
from torch import nn

from tilestore.embed.models.statekeys import Qkv, State, renamed
from tilestore.errors import ModelError

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

# the text side (``_get_large_config``, torchscale's EncoderConfig, their README)
TEXT_VOCABULARY, TEXT_POSITIONS = 64010, 1024
TEXT_TOKENS = 100  # their xlm_tokenizer's max_len, as their README calls it
HEAD_WIDTH = 64  # BEiT-3's attention heads: 1024 wide in 16
TOKENIZER = "tokenizer.spm"  # their XLM-R SentencePiece model (musk/models/ in their code)


@dataclass(frozen=True)
class _Path:
    """One modality's path through the authors' state: its expert in each multiway layer
    (``A`` vision, ``B`` language), where its tensors go in our module, the tensors it
    does not use."""

    expert: str
    prefix: str
    top: dict[str, str]
    unused: re.Pattern


# per layer: the authors' expert -> timm's Block (the rest of the key after the prefix)
_LAYER = {
    "self_attn_layer_norm.{e}.": "norm1.",
    "self_attn.inner_attn_ln.{e}.": "attn.norm.",
    "self_attn.out_proj.{e}.": "attn.proj.",
    "final_layer_norm.{e}.": "norm2.",
    "ffn.{e}.fc1.": "mlp.fc1.",
    "ffn.{e}.ffn_layernorm.": "mlp.norm.",
    "ffn.{e}.fc2.": "mlp.fc2.",
}
# the image features: the vision experts onto timm's ViT; not used: the language experts,
# the token embedding, the text projection and the temperature (text), the image projection
# (zero-shot only: ``with_head``) and the mask token (masked-image pretraining)
IMAGE = _Path(
    "A",
    "vit.",
    {
        "beit3.vision_embed.cls_token": "cls_token",
        "beit3.vision_embed.proj.": "patch_embed.proj.",
        "beit3.encoder.layer_norm.A.": "norm.",
    },
    re.compile(
        r"(\.B\.|^beit3\.text_embed\.|^language_head\.|^logit_scale$|^vision_head\.|"
        r"^beit3\.vision_embed\.mask_token$)"
    ),
)
# the text embedding (`MuskText`): the language experts and the text projection; not used:
# the vision experts, the image embedding, the image projection and the temperature (read
# apart by the text tower)
TEXT = _Path(
    "B",
    "",
    {
        "beit3.text_embed.": "embed.",
        "beit3.encoder.layer_norm.B.": "norm.",
        "language_head.": "head.",
    },
    re.compile(r"(\.A\.|^beit3\.vision_embed\.|^vision_head\.|^logit_scale$)"),
)


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


class XlmTokenizer:
    """Their text ids: transformers' XLMRobertaTokenizer (the slow one, sentencepiece) on
    their SentencePiece model as their ``xlm_tokenizer`` calls it: fairseq's numbering (<s>
    0, <pad> 1, </s> 2, <unk> 3, a piece's id plus one), <s> ids </s> cut to `length` and
    padded with <pad>. Written on sentencepiece itself: transformers 5 reads such a model
    only through protobuf and its converter (the same ids: the tests check it). A text
    holding one of the special tokens' names is refused: theirs reads it as that token."""

    SPECIAL = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
    BOS, PAD, EOS, UNK = 0, 1, 2, 3

    def __init__(self, path) -> None:
        import sentencepiece

        self.pieces = sentencepiece.SentencePieceProcessor(model_file=str(path))

    def __call__(self, texts: list[str], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(n, length) ids and the padding (True where padded)."""
        rows, sizes = [], []
        for text in texts:
            special = [s for s in self.SPECIAL if s in text]
            if special:
                raise ModelError(
                    f"musk: the prompt {text!r} holds {special[0]!r}, a special token of "
                    "MUSK's tokenizer: write it otherwise"
                )
            ids = [i + 1 if i else self.UNK for i in self.pieces.encode(text)][: length - 2]
            ids = [self.BOS, *ids, self.EOS]
            rows.append(ids + [self.PAD] * (length - len(ids)))
            sizes.append(len(ids))
        padding = torch.arange(length)[None] >= torch.tensor(sizes)[:, None]
        return torch.tensor(rows), padding


class MuskText(nn.Module):
    """MUSK's language path: (n, tokens) ids and their padding (True where padded) ->
    (n, 1024) text embeddings (``language_head`` of the class token, unnormalised).

    torchscale's text embedding (no scaling), the language position table from its third
    row (fairseq's offset), the padded tokens zeroed; the same pre-norm sub-LayerNorm layers
    as the image (timm's Block) with the language experts' weights, the padded keys masked
    out of the attention; the final LayerNorm."""

    def __init__(self, depth: int = 24, embed_dim: int = 1024, num_heads: int = 16,
                 vocab: int = TEXT_VOCABULARY, positions: int = TEXT_POSITIONS,
                 mlp_ratio: float = 4.0) -> None:  # fmt: skip
        super().__init__()
        norm = MUSK_LARGE["norm_layer"]
        self.embed = nn.Embedding(vocab, embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, positions - POSITION_OFFSET, embed_dim))
        layer = functools.partial(
            Block, embed_dim, num_heads, mlp_ratio, qkv_bias=True, scale_attn_norm=True,
            scale_mlp_norm=True, norm_layer=norm,
        )  # fmt: skip
        self.blocks = nn.ModuleList(layer() for _ in range(depth))
        self.norm = norm(embed_dim)
        self.head = nn.Linear(embed_dim, embed_dim, bias=False)

    def forward(self, ids: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] > self.pos_embed.shape[1]:
            raise ValueError(f"{ids.shape[1]} tokens: MUSK reads at most {self.pos_embed.shape[1]}")
        x = self.embed(ids) + self.pos_embed[:, : ids.shape[1]]
        x = x * (~padding)[..., None].to(x.dtype)
        # added to the attention's scores (n, heads, queries, keys): -inf on a padded key (a
        # float mask: timm before 1.0.26 added a bool one as 0/1 on its unfused path)
        masked = torch.zeros(padding.shape, dtype=x.dtype, device=x.device)
        masked = masked.masked_fill(padding, float("-inf"))[:, None, None, :]
        for block in self.blocks:
            x = block(x, attn_mask=masked)
        return self.head(self.norm(x)[:, 0])


def musk_state(state: State) -> State:
    """The authors' whole MUSK state (``beit3.*``, the heads, ``logit_scale``; their
    loader strips no prefix) as our image module names it: the vision experts (``.A.``)
    renamed onto timm's ViT under ``vit.`` (`_path_state`); the tensors `IMAGE` does not use
    dropped."""
    return _path_state(state, IMAGE)


def musk_text_state(state: State) -> State:
    """The same state as `MuskText` names it: the language experts (``.B.``), the token
    embedding, the text projection (`_path_state`); the tensors `TEXT` does not use dropped."""
    return _path_state(state, TEXT)


def _path_state(state: State, path: _Path) -> State:
    """One path's tensors of the authors' state under our names: each layer's expert renamed
    onto timm's Block, its query, key and value stacked into ``qkv``, its position table
    without the two unread rows; the tensors `path.unused` names dropped. A key neither
    names is kept as it is (and fails the strict load)."""
    out: State = {}
    qkv = Qkv(("q", "k", "v"), "MUSK's checkpoint")
    layers = {k.format(e=path.expert): v for k, v in _LAYER.items()}
    part_name = re.compile(rf"^self_attn\.([qkv])_proj\.{path.expert}\.(weight|bias)$")
    for key, value in state.items():
        if path.unused.search(key):
            continue
        layer = re.match(r"^beit3\.encoder\.layers\.(\d+)\.(.*)$", key)
        if key == f"beit3.encoder.embed_positions.{path.expert}.weight":
            out[f"{path.prefix}pos_embed"] = value[POSITION_OFFSET:].unsqueeze(0)
        elif layer:
            index, rest = layer.groups()
            part = part_name.match(rest)
            if part:
                qkv.add(f"{path.prefix}blocks.{index}.attn.qkv.{part[2]}", part[1], value)
                continue
            out[renamed(rest, layers, f"{path.prefix}blocks.{index}.") or key] = value
        else:
            out[renamed(key, path.top, path.prefix) or key] = value
    return out | qkv.stacked()
