"""Per-tile class scores in stores: zero-shot probabilities computed from a model's stored
tile features, written beside them at ``<tile group>/zeroshot/<set>`` (the group:
``embeddings/<model>/<plan>``, `tilestore.embeddings.layout`).

A set is one array, ``probabilities`` (tile, class) float32, a row per tile of the features
in their order, and its record (``tilestore`` attributes): the classes, the prompts, the
text tower's weights, the slide's score per class and the rule that made it, and the tile
group it read (its ``finished`` time, as a slide vector records it). Readers
(`tilestore.embeddings.read.open_embeddings`, so the viewer and the exports) show each set
as per-tile columns: ``<set>:<class>`` the class's probability, ``<set>`` the most probable
class's name; a set whose tile group was embedded again since is left out, with a warning.
Sets of one name from several stores are one column only where their records agree on what
made them (`score_recipe`: text tower, weights, prompts, logit scale; `recipe.combine`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from tilestore.embeddings.groups import all_finite, find_group
from tilestore.embeddings.recipe import Recipe, with_facts
from tilestore.errors import EmbeddingError, StaleSlideEmbedding
from tilestore.format import leftovers
from tilestore.format.codecs import zstd_codecs
from tilestore.format.records import EmbeddingsRecord, ScoresRecord, read_record, write_record
from tilestore.format.store import open_for_writing

ZEROSHOT = "zeroshot"  # the subgroup of a model's group holding its score sets
PROBABILITIES = "probabilities"  # a set's array: (tile, class)


# what a set's values depend on besides the features: its record's facts compared wherever
# sets of one name meet (`score_recipe`); not the machine's paths (the weights folder, the
# prompts file) nor the revision (the weights' sha256 says whether they are one file)
SCORE_FACTS = ("classes", "text_tower", "weights_sha256", "logit_scale", "logit_bias",
               "class_embedding", "slide_rule")  # fmt: skip


@dataclass(frozen=True)
class ScoreSet:
    """One current score set of a group: its probabilities (tile, class), its classes
    (the columns) and its record."""

    probabilities: zarr.Array
    classes: list[str]
    record: ScoresRecord


def score_recipe(tiles: Recipe, record: ScoresRecord) -> Recipe:
    """The recipe of a score set: its tile features' (`tiles`) and what its record says
    made the scores (`SCORE_FACTS`, the prompts' classes and templates): sets of one name
    from several stores meet only where these are one (`combine`)."""
    facts = {k: record.get(k) for k in SCORE_FACTS if k in record}
    prompts = record.get("prompts")
    if isinstance(prompts, dict):
        facts["prompts"] = {k: prompts[k] for k in ("classnames", "templates") if k in prompts}
    return with_facts(tiles, "scores", facts)


def scores_group_name(tiles_path: str, name: str) -> str:
    """<tile group>/zeroshot/<name>."""
    return f"{tiles_path}/{ZEROSHOT}/{name}"


def write_tile_scores(
    store: str | Path,
    tiles_path: str,
    name: str,
    probabilities: np.ndarray,
    record: dict[str, Any],
    tiles: dict[str, Any],
) -> str:
    """Write one set of per-tile class probabilities beside the features of the tile group at
    `tiles_path` (replacing a set of that name); return its path in the store.

    record: what made them (its ``classes`` name the columns); tiles: the tile group read
    (``finished``, ``tiles``), refused as stale where the group was embedded again meanwhile.
    Made in a hidden group and renamed into place whole."""
    store = Path(store)
    values = np.asarray(probabilities, dtype=np.float32)
    classes = list(record["classes"])
    if values.shape != (int(tiles["tiles"]), len(classes)) or not all_finite(values):
        raise EmbeddingError(
            f"{store}: {values.shape} scores for {tiles['tiles']} tiles and {len(classes)} "
            "classes, or values that are not finite; nothing written"
        )
    current = zarr.open_group(store, path=tiles_path, mode="r", zarr_format=3)
    now = read_record(current, EmbeddingsRecord, f"{store}: {tiles_path}")
    if (now or EmbeddingsRecord()).finished != str(tiles["finished"]):
        raise StaleSlideEmbedding(
            f"{store}: {tiles_path} was embedded again while the scores were computed; run it again"
        )
    path = scores_group_name(tiles_path, name)
    target = store / path
    root = open_for_writing(store)
    root.require_group(f"{tiles_path}/{ZEROSHOT}")
    leftovers.clear(target)
    with leftovers.built_beside(target, "cannot write the scores") as hidden:
        group = root.create_group(str(hidden.relative_to(store)))
        rows = max(1, min(len(values), 2**16))
        array = group.create_array(PROBABILITIES, shape=values.shape, dtype="float32",
                                   chunks=(rows, len(classes)), **zstd_codecs(level=3))  # fmt: skip
        array[:] = values
        made = ScoresRecord.make(f"{store}: {path}", **{**record, "tiles": dict(tiles)})
        write_record(group, made)
    return path


def score_sets(group: zarr.Group, where: str) -> dict[str, ScoreSet]:
    """A finished embeddings group's current score sets by name;
    a set made from the group's earlier features (embedded again since) left out, with a
    warning naming it."""
    if ZEROSHOT not in group:
        return {}
    finished = (read_record(group, EmbeddingsRecord, where) or EmbeddingsRecord()).finished
    found = {}
    for name, sub in sorted(group[ZEROSHOT].groups()):
        if name.startswith("."):  # a write in progress, or one a kill left (never read)
            continue
        record = read_record(sub, ScoresRecord, f"{where}/{ZEROSHOT}/{name}") or ScoresRecord()
        if record.made_from != finished:
            warnings.warn(
                f"{where}/{ZEROSHOT}/{name} was scored from features embedded again since: "
                "left out (classify the store again)",
                stacklevel=3,
            )
            continue
        found[name] = ScoreSet(sub[PROBABILITIES], list(record.classes), record)
    return found


def read_tile_scores(
    store: str | Path, model: str, name: str, plan: str | None = None
) -> dict[str, Any]:
    """One set as written: {"probabilities": (tile, class), "record": its record}; of the
    model's group of `plan` (None: its only plan's)."""
    path = scores_group_name(find_group(store, model, plan), name)
    group = zarr.open_group(Path(store), path=path, mode="r", zarr_format=3)
    record = read_record(group, ScoresRecord, f"{store}: {path}")
    if record is None:
        raise KeyError(f"{path}'s record")
    return {"probabilities": group[PROBABILITIES][:], "record": record.to_attrs()}
