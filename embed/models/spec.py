"""What a tile encoder is (`ModelSpec`: facts from its model card) and the error it raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tilestore.errors import TilestoreError
from tilestore.plan.options import DEFAULT_TILE


class ModelError(TilestoreError):
    """A model that is unknown, gated, missing from the offline cache or unloadable."""


@dataclass(frozen=True)
class ModelSpec:
    """Facts about one tile encoder."""

    name: str
    source: str  # "hf-hub", "package", "timm" or "local"
    repo: str  # hub repo, package name, timm architecture or folder
    output_dim: int | None
    native_mpp: float | None  # um/px the model was trained at (tiles should match)
    tile: int = DEFAULT_TILE  # tile side a plan for this model uses, before any crop
    timm_kwargs: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # overrides of timm's data config
    pooling: str = "model"  # "model": timm's pooled output; "cls+mean": Virchow's concat
    gated: bool = False
    card: str = ""
