"""What stored features were computed from, and the one rule for whether results may meet.

Two stores embedded "with the same model" are one population only where the weights, the
pooling, any projection, the precision, the input size, the transform and the channels read
are the same (their `Recipe`: a CLS token is not a CLS + mean vector, bf16 features are not
fp32 ones), and where their tiles show the tissue at one scale (their `Scale`: 224 px tiles at
0.5 um/px are not 32 px tiles at 0.25 um/px, nor tiles of a slide whose pixel size is
unknown). `combine` is that rule: every reader and export that puts results of several stores
together calls it (`open_embeddings`, `open_slide_embeddings`, `export h5`, the viewer, and
through them the analyses and k-means): a cohort of mixed recipes is refused, one of mixed
scales is refused unless the user names the scale to keep, never concatenated.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from tilestore.errors import MixedResults, TilestoreWarning
from tilestore.options import Opt
from tilestore.reading.resolution import MPP_TOLERANCE

# The scale a user keeps of a cohort whose stores were planned at several (`combine`).
ScaleLabel = Annotated[
    str | None,
    Opt(
        "Of stores planned at several scales, keep those at this one (the others are left "
        "out with a warning).",
        pattern=r"(level0|\d+(\.\d+)?mpp)-\d+px(-s\d+)?",
        shape="a scale's label, e.g. 0.5mpp-224px or level0-256px",
        metavar="LABEL",
        none="refused where they differ",
    ),
]

# the model facts compared (``weights``, a path on the machine that ran, is not)
MODEL_FACTS = (
    "name",
    "repo",
    "revision",
    "architecture",
    "pooling",
    "projection",
    "output_dim",
    "input_size",
    "transform_sha",
)


@dataclass(frozen=True)
class Scale:
    """The scale a group's tiles show the tissue at: um/px as read (None: level-0 pixels of
    a slide whose pixel size is unknown), tile side and stride in px at that um/px."""

    mpp: float | None
    tile: int
    stride: int

    @property
    def label(self) -> str:
        """Its name, as plans are named: 0.5mpp-224px, 0.25mpp-32px-s16, level0-224px."""
        mpp = "level0" if self.mpp is None else f"{self.mpp:.3g}mpp"
        stride = f"-s{self.stride}" if self.stride != self.tile else ""
        return f"{mpp}-{self.tile}px{stride}"

    def matches(self, other: Scale, tolerance: float = MPP_TOLERANCE) -> bool:
        """Equal tiles and strides at pixel sizes within `tolerance` of each other (two
        scanners' 0.499 and 0.5015 um/px are one scale; an unknown one matches none)."""
        if (self.tile, self.stride) != (other.tile, other.stride):
            return False
        if self.mpp is None or other.mpp is None:
            return self.mpp is None and other.mpp is None
        return abs(self.mpp / other.mpp - 1) <= tolerance

    def named(self, label: str) -> bool:
        """Whether `label` (as the user gives it) names this scale."""
        try:
            return self.matches(parse_scale(label))
        except ValueError:
            return False


def parse_scale(label: str) -> Scale:
    """A scale from its label ("0.5mpp-224px", "level0-224px", "0.5mpp-224px-s112")."""
    parts = label.strip().split("-")
    if len(parts) not in (2, 3) or not parts[1].endswith("px"):
        raise ValueError(label)
    mpp = None if parts[0] == "level0" else float(parts[0].removesuffix("mpp"))
    tile = int(parts[1].removesuffix("px"))
    stride = int(parts[2].removeprefix("s")) if len(parts) == 3 else tile
    return Scale(mpp, tile, stride)


@dataclass(frozen=True)
class Recipe:
    """What a group's features were computed from: the model's facts and the precision
    (`facts`), the channels read as R, G, B, and the tiles' scale."""

    facts: dict[str, Any]
    channels: tuple[str, ...] | None
    scale: Scale | None  # None: a group from before scales were recorded

    def differences(self, other: Recipe) -> list[str]:
        """``fact: a vs b`` for each fact both hold and disagree on (the scale aside)."""
        diff = [
            f"{k}: {self.facts[k]} vs {other.facts[k]}"
            for k in self.facts
            if k in other.facts and self.facts[k] != other.facts[k]
        ]
        if self.channels != other.channels:
            diff.append(f"channels: {_channels(self.channels)} vs {_channels(other.channels)}")
        return diff


def transform_hash(described: dict[str, Any]) -> str:
    """A short hash of a transform's description (sizes, interpolation, mean, std)."""
    text = json.dumps(described, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def recipe(meta: dict[str, Any]) -> Recipe:
    """The recipe of a group from its ``tilestore`` attributes. Groups written before a fact
    was recorded lack it, and are compared on the facts they have; their transform's hash is
    made from the transform they recorded."""
    model = meta.get("model") or {}
    facts = {key: model[key] for key in MODEL_FACTS if key in model}
    if "transform_sha" not in facts and isinstance(model.get("transform"), dict):
        facts["transform_sha"] = transform_hash(model["transform"])
    if "input_size" not in facts and isinstance(model.get("transform"), dict):
        facts["input_size"] = model["transform"].get("input_size")
    if facts.get("pooling") == "model" and "family" not in model:
        del facts["pooling"]  # older records named timm's pooled output "model", whatever it was
    if "precision" in meta:
        facts["precision"] = meta["precision"]
    channels = tuple(meta["channels"]) if meta.get("channels") else None
    return Recipe(facts, channels, scale_of(meta))


def scale_of(meta: dict[str, Any]) -> Scale | None:
    """The scale of a group's tiles from its attributes (its grid: tile, stride, the um/px
    asked for, which the pixels read are within the tolerance of; None where the slide's
    pixel size is unknown); None where the group records no grid."""
    grid = meta.get("grid") or {}
    tile = meta.get("tile_size") or grid.get("tile")
    if tile is None:
        return None
    mpp = grid.get("mpp", meta.get("mpp")) if meta.get("mpp") is not None else None
    return Scale(mpp, int(tile), int(grid.get("stride") or tile))


def combine(found: Sequence[tuple[str, Recipe]], what: str, scale: str | None = None) -> list[int]:
    """Which of these results may be put together: the indices kept, in order.

    found: (store, recipe) of each result; what: what they are, for messages ("'uni'
    embeddings"). Recipes that differ are refused (`MixedResults` naming both stores and
    the facts); so are scales that differ, unless `scale` names the one to keep (its label:
    "0.5mpp-224px"): the others are then left out with a warning. A refusal lists the
    scales found and the stores at each, so the user can name one.
    """
    if scale is not None:
        kept = [i for i, (_, r) in enumerate(found) if r.scale is not None and r.scale.named(scale)]
        if not kept:
            raise MixedResults(
                f"scale={scale!r}: none of these {what} is at that scale ({_groups(found)})"
            )
        left = [found[i][0] for i in range(len(found)) if i not in kept]
        if left:
            warnings.warn(
                f"left out {len(left)} store(s) whose {what} are not at {scale} "
                f"({', '.join(left[:3])}{' ...' if len(left) > 3 else ''})",
                TilestoreWarning,
                stacklevel=3,
            )
    else:
        kept = list(range(len(found)))
    first_store, first = found[kept[0]]
    for i in kept[1:]:
        store, other = found[i]
        diff = first.differences(other)
        if diff:
            raise MixedResults(
                f"{store}: its {what} were made with other settings than {first_store}'s "
                f"({'; '.join(diff[:3])}); open them separately, or embed again with the same "
                "settings"
            )
        if scale is None and not _same_scale(first.scale, other.scale):
            raise MixedResults(
                f"{store}: its {what} come from tiles at another scale than {first_store}'s "
                f"({_groups(found)}): features of different scales are not one population; "
                "name the one to keep with scale=<label>, or plan and embed them alike"
            )
    return kept


def _same_scale(a: Scale | None, b: Scale | None) -> bool:
    if a is None or b is None:  # a group from before scales were recorded: not judged
        return True
    return a.matches(b)


def _groups(found: Sequence[tuple[str, Recipe]]) -> str:
    """The scales found, each with its stores: "0.5mpp-224px: 2 stores (a, b); ..."."""
    groups: list[tuple[Scale | None, list[str]]] = []
    for store, r in found:
        for scale, stores in groups:
            if _same_scale(scale, r.scale) and (scale is None) == (r.scale is None):
                stores.append(store)
                break
        else:
            groups.append((r.scale, [store]))
    return "; ".join(
        f"{scale.label if scale else 'scale not recorded'}: {len(stores)} store(s) "
        f"({', '.join(Path(s).name for s in stores[:2])}{' ...' if len(stores) > 2 else ''})"
        for scale, stores in groups
    )


def _channels(channels: tuple[str, ...] | None) -> str:
    return ",".join(channels) if channels else "RGB"
