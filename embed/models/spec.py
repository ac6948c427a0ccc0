"""What a tile encoder is (`ModelSpec`: facts from its model card) and the error it raises."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tilestore.plan.options import DEFAULT_TILE

# How a model's features are drawn from its final token sequence (`tilestore.embed.models.encoder`).
POOLINGS = {
    "cls": "the class token",
    "cls+mean": "the class token and the mean of the patch tokens, concatenated",
    "mean": "the mean of the patch tokens",
    "token-mean": "the mean of every token, the class token with the patches (iSight's)",
    "attn-pool": "the model's attentional pooler (learned queries attending to the tokens)",
    "multiscale": "the class token of each scale the model reads the tile at, concatenated "
    "(its prefix tokens: MUSK's ms_aug)",
    "model": "the module's own output (timm's pooled features)",
}

# The text towers zero-shot classification builds from a checkpoint's own text half
# (`tilestore.embed.models.text`), and what each is.
TEXT_TOWERS = {
    "clip": "transformers' CLIPModel: its text model and projection, CLIP's tokenizer",
    "siglip": "transformers' SiglipModel: its text model, SigLIP's tokenizer, a logit bias",
    "conch": "CONCH's CoCa text transformer (a class token appended), its byte-level BPE",
    "open_clip": "open_clip's text tower of the same model, its tokenizer (a Hugging Face "
    "BERT built from the repo its open_clip_config.json names, for BiomedCLIP)",
    "keep": "KEEP's BERT (transformers' BertModel of its config.json's text_config), its "
    "pooled output, its WordPiece tokenizer",
    "musk": "MUSK's language experts (its BEiT-3's second path), its XLM-R SentencePiece "
    "tokenizer; the image's class token through its vision_head",
}
# the text towers whose tokenizer files are in the checkpoint's own repo (fetched beside it)
TOKENIZER_IN_REPO = frozenset({"clip", "siglip", "keep"})
# the text towers whose tokenizer is a file their authors ship apart (`tokenizer=` gives it)
TOKENIZER_FILE = frozenset({"conch", "musk"})


# a family -> the library whose code builds its models (the others: ours, `ModelSpec.code`)
LIBRARIES = {"timm": "timm", "transformers": "transformers", "open_clip": "open_clip"}


@dataclass(frozen=True)
class Arch:
    """How a model is built: `family` names a builder (`tilestore.embed.models.families`),
    `name` the architecture in it (a timm name, a transformers class, a variant), `kwargs`
    what its model card sets. Enough to build it without weights, on the meta device."""

    family: str
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    convert: str | None = None  # the published weights' layout, where it is not the family's
    # whether the checkpoint's config.json is read (False where the repo's config is for
    # another library's code: Hibou's is for its remote transformers classes)
    config: bool = True
    # "bf16": the rotary periods rounded to bfloat16, as the authors' release stores them
    # (DINOv3's), where timm computes them in float32 at build
    periods: str | None = None

    def __post_init__(self) -> None:
        if self.periods is not None and (self.family, self.periods) != ("timm", "bf16"):
            raise ValueError(
                f"{self.name}: periods={self.periods!r} is made for timm's DINOv3 only "
                "(family 'timm', periods 'bf16')"
            )


@dataclass(frozen=True)
class ModelSpec:
    """Facts about one tile encoder."""

    name: str
    source: str  # "hf-hub", "url" (one file, pinned: `sha256`), "package", "timm" or "local"
    repo: str  # hub repo, package name, timm architecture or folder
    output_dim: int | None
    native_mpp: float | None  # um/px the model was trained at (tiles should match)
    tile: int = DEFAULT_TILE  # tile side a plan for this model uses, before any crop
    # the transform: input_size, interpolation, crop_pct, mean, std (over timm's data config)
    data: dict[str, Any] = field(default_factory=dict)
    pooling: str = "model"  # a key of POOLINGS
    gated: bool = False
    card: str = ""
    arch: Arch | None = None  # None: the checkpoint's config.json names a timm architecture
    # the weights file in the repo, where it is not model.safetensors / pytorch_model.bin
    weights_file: str | None = None
    repo_type: str = "model"  # "dataset" for weights published in a dataset repo
    # a projection after pooling: "clip" (CLIP's post-norm + projection), "contrast" (CONCH's),
    # "keep" (KEEP's head, Linear-GELU-Linear, then an L2 normalisation)
    projection: str | None = None
    precision: str = "fp32"  # what the authors run it in (their code / card)
    licence: str = ""
    reference: str = ""  # the implementation ours is checked against (bench/encoders.py)
    # the text tower zero-shot classification builds from the same checkpoint (a key of
    # TEXT_TOWERS); None: an image encoder alone, or one whose text half is not published
    text: str | None = None
    # a "url" source's file: the sha256 of its bytes, pinned (`tilestore.embed.models.files`)
    sha256: str | None = None

    def __post_init__(self) -> None:
        pinned = self.sha256 is not None and re.fullmatch(r"[0-9a-f]{64}", self.sha256)
        if (self.source == "url" and not pinned) or (self.sha256 is not None and not pinned):
            raise ValueError(f"{self.name}: a url source pins its file's sha256 (64 hex)")
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"{self.name}: pooling {self.pooling!r} is not one of {list(POOLINGS)}"
            )
        if self.text is not None and self.text not in TEXT_TOWERS:
            raise ValueError(f"{self.name}: text {self.text!r} is not one of {list(TEXT_TOWERS)}")

    @property
    def family(self) -> str:
        return self.arch.family if self.arch else "timm"

    @property
    def code(self) -> str:
        """Where the model's code comes from: the library that builds it (timm,
        transformers, open_clip), or ours (the authors' construction written here, checked
        against their code: `reference`). No model runs code from its weights' repo."""
        return LIBRARIES.get(self.family, "tilestore")
