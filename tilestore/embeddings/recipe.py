"""What stored features were computed from, and the one rule for whether results may meet.

Two stores embedded "with the same model" are one population only where the weights, the
pooling, any projection, the precision, the input size, the transform and the channels read
are the same (their `Recipe`: a CLS token is not a CLS + mean vector, bf16 features are not
fp32 ones), and where their tiles show the tissue at one scale (their `Scale`: 224 px tiles at
0.5 um/px are not 32 px tiles at 0.25 um/px, nor tiles of a slide whose pixel size is
unknown). `combine` is that rule: every reader and export that puts results of several stores
together calls it (`open_embeddings`, `open_slide_embeddings`, `export h5`, `classify`, the
viewer, and through them the analyses and k-means): a cohort of mixed recipes is refused, one
of mixed scales is refused unless the user names the scale to keep, never concatenated.
Results computed from the features meet by the same rule, their own record's facts added to
the features' recipe (`with_facts`): slide vectors, zero-shot score sets and quality and QC
columns of one name; a query from elsewhere meets a Dataset's tiles (`ds.tiles.nearest`)
through the recipes the Dataset carries (`Recipes`).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

from tilestore.errors import MixedResults, TilestoreWarning
from tilestore.options import Opt
from tilestore.plan.grid import GridSpec
from tilestore.reading.resolution import MPP_TOLERANCE

# The scale a user keeps of a cohort whose stores were planned at several (`combine`).
ScaleLabel = Annotated[
    str | None,
    Opt(
        "Of stores planned at several scales, keep those at this one (the others are left "
        "out with a warning).",
        # um/px above 0 (a 0 um/px scale divided by zero), tile and stride from 1 px
        pattern=r"(level0|(?!0*(\.0*)?mpp)\d+(\.\d+)?mpp)-0*[1-9]\d*px(-s0*[1-9]\d*)?",
        shape="a scale's label, e.g. 0.5mpp-224px or level0-256px: um/px above 0, sizes of "
        "1 px or more",
        metavar="LABEL",
        none="refused where they differ",
    ),
]

# the model facts compared (``weights``, a path on the machine that ran, is not)
MODEL_FACTS = (
    "name",
    "repo",
    "revision",
    "weights_sha256",  # the weights file itself: two local files of one name are not one model
    "weights_seed",  # random weights asked for: the seed they were drawn with
    "architecture",
    "periods",  # built otherwise than its library builds it (DINOv3's rounded periods)
    "pooling",
    "projection",
    "output_dim",
    "input_size",
    "transform_sha",
)


# Two groups whose tiles were read at pixel sizes this close show the tissue at one scale: a
# plan reads a level as it is where mpp / level_mpp is within MPP_TOLERANCE of 1, so two
# plans of one um/px may read levels (1 + t) / (1 - t) apart (0.49 and 0.51 for 0.5, 4.1%);
# resampled ones land within 0.2% of what was asked.
SCALE_TOLERANCE = (1 + MPP_TOLERANCE) / (1 - MPP_TOLERANCE) - 1


@dataclass(frozen=True)
class Scale:
    """The scale a group's tiles show the tissue at: um/px as read (the pixels' own, not the
    um/px asked; None: level-0 pixels of a slide whose pixel size is unknown), tile side and
    stride in px at that um/px."""

    mpp: float | None
    tile: int
    stride: int

    @property
    def label(self) -> str:
        """Its name, as plans are named: 0.5mpp-224px, 0.25mpp-32px-s16, level0-224px."""
        mpp = "level0" if self.mpp is None else f"{self.mpp:.3g}mpp"
        stride = f"-s{self.stride}" if self.stride != self.tile else ""
        return f"{mpp}-{self.tile}px{stride}"

    @property
    def grid(self) -> tuple[int, int, bool]:
        """What must be equal for two scales to be one: tile, stride, pixel size known."""
        return self.tile, self.stride, self.mpp is not None

    def matches(self, other: Scale, tolerance: float = SCALE_TOLERANCE) -> bool:
        """Equal tiles and strides at pixel sizes within `tolerance` of each other, either
        way round (two scanners' 0.499 and 0.5015 um/px are one scale; an unknown pixel
        size matches only another unknown one)."""
        if self.grid != other.grid:
            return False
        return self.mpp is None or _apart(self.mpp, other.mpp) <= tolerance

    def named(self, label: str) -> bool:
        """Whether `label` (as the user gives it) names this scale."""
        try:
            return self.matches(parse_scale(label))
        except ValueError:
            return False


def _apart(a: float, b: float) -> float:
    """How far apart two pixel sizes are, the same either way round: larger/smaller - 1."""
    return max(a, b) / min(a, b) - 1


def parse_scale(label: str) -> Scale:
    """A scale from its label ("0.5mpp-224px", "level0-224px", "0.5mpp-224px-s112")."""
    parts = label.strip().split("-")
    if len(parts) not in (2, 3) or not parts[1].endswith("px"):
        raise ValueError(label)
    mpp = None if parts[0] == "level0" else float(parts[0].removesuffix("mpp"))
    tile = int(parts[1].removesuffix("px"))
    stride = int(parts[2].removeprefix("s")) if len(parts) == 3 else tile
    if (mpp is not None and not 0 < mpp < float("inf")) or tile < 1 or stride < 1:
        raise ValueError(label)  # no tiles are at 0 um/px or 0 px (matches divides by mpp)
    return Scale(mpp, tile, stride)


@dataclass(frozen=True)
class Recipe:
    """What a group's features were computed from: the model's facts and the precision
    (`facts`), the channels read as R, G, B, and the tiles' scale."""

    facts: dict[str, Any]
    channels: tuple[str, ...] | None
    scale: Scale | None  # None: a group from before scales were recorded
    unknown_weights: str | None = None  # why its weights are not known (`weights_unknown`)


def weights_unknown(model: dict[str, Any]) -> str | None:
    """Why a group's weights cannot be known again, from its record's model (None: they
    can): random weights drawn without a seed (``timm:<arch>`` without its weights, and
    ``random:`` before the seed was recorded) are weights no other run draws, so such a
    group is never resumed (`tilestore.embeddings.write`) nor put with another (`combine`).
    A group that records no weights at all (features stored by `write_features` with a
    model named only) is compared on what it records, as before."""
    if model.get("weights") == "random" and model.get("weights_seed") is None:
        return "random weights drawn without a seed"
    return None


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
    return Recipe(facts, channels, scale_of(meta), weights_unknown(model))


def scale_of(meta: dict[str, Any] | GridSpec) -> Scale | None:
    """The scale of a plan's tiles (its `GridSpec`) or of a group's (its attributes, which
    the writer took from the plan's grid through this function): tile and stride, and the
    um/px the pixels were read at (the plan's effective um/px: a level read as is may be
    off the um/px asked by up to the plan's tolerance; level-0 pixels of a slide with a
    pixel size are at its pixel size; None only where the slide's is unknown); None where
    no grid is recorded. The one function for a scale: the run's checks and per-slide
    line, the writer's record, and every reader's comparison."""
    if isinstance(meta, GridSpec):
        mpp = meta.effective_mpp
        return Scale(None if mpp is None else float(mpp), meta.tile, meta.stride)
    grid = meta.get("grid") or {}
    tile = meta.get("tile_size") or grid.get("tile")
    if tile is None:
        return None
    mpp = meta.get("mpp", grid.get("effective_mpp"))
    return Scale(None if mpp is None else float(mpp), int(tile), int(grid.get("stride") or tile))


@dataclass(frozen=True)
class Recipes:
    """The recipes of the stores whose features a Dataset holds, as `combine` kept them
    (``ds.attrs["recipes"]``, `open_embeddings`): what a query from elsewhere must meet
    (`ds.tiles.nearest`, a floor below, asks `meet` without importing this module)."""

    found: tuple[tuple[str, Recipe], ...]

    def meet(self, other: Recipes | Recipe, what: str) -> None:
        """MixedResults where `other` (another Dataset's recipes, or one recipe: a vector
        from a recorded group) may not meet these features (`combine`, no scale kept)."""
        theirs = other.found if isinstance(other, Recipes) else (("the query", other),)
        combine([*self.found, *theirs], what)


def with_facts(tiles: Recipe, what: str, facts: Mapping[str, Any]) -> Recipe:
    """The recipe of a result computed from a group's features (a slide vector, a score
    set, quality measures, QC shares): the features' recipe and the facts of the result's
    own record that make its values what they are, each named "<what> <fact>" (so
    `combine` names the one that differs)."""
    return replace(tiles, facts={**tiles.facts, **{f"{what} {k}": v for k, v in facts.items()}})


def combine(found: Sequence[tuple[str, Recipe]], what: str, scale: str | None = None) -> list[int]:
    """Which of these results may be put together: the indices kept, in order.

    found: (store, recipe) of each result; what: what they are, for messages ("'uni'
    embeddings"). Recipes that differ in a fact (each store's facts against every fact the
    stores before it recorded) are refused (`MixedResults` naming the stores and the facts);
    so are scales that are not one (tiles and strides equal, pixel sizes within
    `SCALE_TOLERANCE` from the smallest to the largest, groups from before scales were
    recorded on their own), unless `scale` names the one to keep (its label:
    "0.5mpp-224px"): the others are then left out with a warning. The answer does not
    depend on the stores' order; a refusal lists the scales found and the stores at each.
    """
    if scale is not None:
        named = parse_scale(scale)
        kept = [
            i for i, (_, r) in enumerate(found) if r.scale is not None and r.scale.matches(named)
        ]
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
    _known_weights([found[i] for i in kept], what)
    _one_recipe([found[i] for i in kept], what)
    if scale is None and not _one_scale([found[i][1].scale for i in kept]):
        raise MixedResults(
            f"these {what} come from tiles at more than one scale ({_groups(found)}): "
            "features of different scales are not one population; name the one to keep "
            "with scale=<label>, or plan and embed them alike"
        )
    return kept


def _known_weights(found: Sequence[tuple[str, Recipe]], what: str) -> None:
    """MixedResults where results of several stores include one whose weights are not
    known (`weights_unknown`): nothing says they are the others' weights (two runs of
    ``timm:<arch>`` without its weights drew other weights: cosine 0.015 between their
    features of the same tiles). One store alone is read as it is."""
    if len(found) < 2:
        return
    unknown = [(store, r.unknown_weights) for store, r in found if r.unknown_weights]
    if unknown:
        names = ", ".join(Path(store).name for store, _ in unknown[:3])
        more = " ..." if len(unknown) > 3 else ""
        raise MixedResults(
            f"{unknown[0][0]}: its {what} were made with {unknown[0][1]} ({len(unknown)} of "
            f"{len(found)} stores: {names}{more}), weights no other run has: they cannot be "
            "put with other stores' features; open it alone, or embed again with pretrained "
            "weights or random:<architecture> (seeded)"
        )


def _one_recipe(found: Sequence[tuple[str, Recipe]], what: str) -> None:
    """MixedResults where a store's facts differ from those any store before it recorded
    (so a store that lacks a fact, made before it was recorded, hides nothing)."""
    seen: dict[str, tuple[Any, str]] = {}
    channels: tuple[tuple[str, ...] | None, str] | None = None
    for store, r in found:
        diff = [
            f"{k}: {seen[k][0]} ({Path(seen[k][1]).name}) vs {v}" for k, v in r.facts.items()
            if k in seen and seen[k][0] != v
        ]  # fmt: skip
        if channels is not None and channels[0] != r.channels:
            was, where = _channels(channels[0]), Path(channels[1]).name
            diff.append(f"channels: {was} ({where}) vs {_channels(r.channels)}")
        if diff:
            raise MixedResults(
                f"{store}: its {what} were made with other settings than the stores before it "
                f"({'; '.join(diff[:3])}); open them separately, or embed again with the same "
                "settings"
            )
        for k, v in r.facts.items():
            seen.setdefault(k, (v, store))
        channels = channels or (r.channels, store)


def _one_scale(scales: Sequence[Scale | None]) -> bool:
    """Whether these scales are one: all recorded or none, one tile and stride, pixel sizes
    within the tolerance from the smallest to the largest."""
    if not scales or all(s is None for s in scales):
        return True
    if any(s is None for s in scales) or len({s.grid for s in scales}) > 1:
        return False
    known = [s.mpp for s in scales if s.mpp is not None]
    return not known or _apart(min(known), max(known)) <= SCALE_TOLERANCE


def _groups(found: Sequence[tuple[str, Recipe]]) -> str:
    """The scales found, each with its stores: "0.5mpp-224px: 2 store(s) (a, b); ..."."""
    groups: dict[tuple | None, list[tuple[str, Scale | None]]] = {}
    for store, r in found:
        groups.setdefault(None if r.scale is None else r.scale.grid, []).append((store, r.scale))
    parts = []
    for grid, members in groups.items():
        stores = [Path(s).name for s, _ in members]
        if grid is None:
            label = "scale not recorded"
        else:
            mpps = sorted({sc.mpp for _, sc in members if sc.mpp is not None})
            first = members[0][1]
            label = (
                first.label
                if len(mpps) <= 1
                else (f"{mpps[0]:.3g}-{mpps[-1]:.3g}mpp-{first.label.split('-', 1)[1]}")
            )
        parts.append(
            f"{label}: {len(stores)} store(s) ({', '.join(stores[:2])}"
            f"{' ...' if len(stores) > 2 else ''})"
        )
    return "; ".join(parts)


def _channels(channels: tuple[str, ...] | None) -> str:
    return ",".join(channels) if channels else "RGB"
