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

A trained model's scores (`tilestore.learn.explanation`) sit beside them at
``<tile group>/learned/<run>``: one array, ``scores`` (tile, column) float32, and its
`LearnedRecord` (the columns: ``attention`` where the model has one, then each output's
contribution; the run and its feature recipe; the tile group it read). Readers show each
column as ``<run>:<column>``, left out with a warning as stale as a zero-shot set.
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
from tilestore.format.records import (
    EmbeddingsRecord,
    GroupRecord,
    LearnedRecord,
    ScoresRecord,
    read_record,
    write_record,
)
from tilestore.format.store import open_for_writing
from tilestore.sources.remote import is_url, url_store

ZEROSHOT = "zeroshot"  # the subgroup of a model's group holding its score sets
PROBABILITIES = "probabilities"  # a set's array: (tile, class)
LEARNED = "learned"  # the subgroup holding a trained model's tile scores, a set per run
SCORES = "scores"  # a learned set's array: (tile, column)


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
    return _write_set(store, tiles_path, ZEROSHOT, name, PROBABILITIES, probabilities,
                      ScoresRecord, {**record, "tiles": dict(tiles)}, list(record["classes"]),
                      tiles)  # fmt: skip


def write_learned_scores(
    store: str | Path,
    tiles_path: str,
    name: str,
    scores: np.ndarray,
    columns: list[str],
    run: dict[str, Any],
    tiles: dict[str, Any],
) -> str:
    """Write one trained model's per-tile scores (`columns`) beside the features of the tile
    group at `tiles_path` as ``learned/<name>`` (replacing a set of that name); `run`: what
    made them (the run's folder, model, task, feature recipe). As `write_tile_scores`."""
    record = {"columns": list(columns), "run": dict(run), "tiles": dict(tiles)}
    return _write_set(store, tiles_path, LEARNED, name, SCORES, scores, LearnedRecord, record,
                      list(columns), tiles)  # fmt: skip


def _write_set(
    store: str | Path,
    tiles_path: str,
    kind: str,
    name: str,
    array_name: str,
    values: np.ndarray,
    record_type: type[GroupRecord],
    record: dict[str, Any],
    classes: list[str],
    tiles: dict[str, Any],
) -> str:
    """One set of per-tile values (tile, column) at <tile group>/<kind>/<name>, made in a
    hidden group and renamed into place whole; refused where the values do not fit the
    tiles or are not finite, or where the tile group was embedded again meanwhile."""
    store = Path(store)
    values = np.asarray(values, dtype=np.float32)
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
    path = f"{tiles_path}/{kind}/{name}"
    target = store / path
    root = open_for_writing(store)
    root.require_group(f"{tiles_path}/{kind}")
    leftovers.clear(target)
    with leftovers.built_beside(target, "cannot write the scores") as hidden:
        group = root.create_group(str(hidden.relative_to(store)))
        rows = max(1, min(len(values), 2**16))
        array = group.create_array(array_name, shape=values.shape, dtype="float32",
                                   chunks=(rows, len(classes)), **zstd_codecs(level=3))  # fmt: skip
        array[:] = values
        made = record_type.make(f"{store}: {path}", **record)
        write_record(group, made)
    return path


def score_sets(group: zarr.Group, where: str) -> dict[str, ScoreSet]:
    """A finished embeddings group's current score sets by name;
    a set made from the group's earlier features (embedded again since) left out, with a
    warning naming it."""
    return {
        name: ScoreSet(sub[PROBABILITIES], list(record.classes), record)
        for name, sub, record in _current(group, where, ZEROSHOT, ScoresRecord, "classify")
    }


def _current(group: zarr.Group, where: str, kind: str, record_type: type, again: str):
    """(name, group, record) of each set under `kind` made from the group's current features,
    in name order; one made before they were embedded again left out with a warning saying
    to `again` the store; hidden names (a write in progress, or one a kill left) never read."""
    if kind not in group:
        return []
    finished = (read_record(group, EmbeddingsRecord, where) or EmbeddingsRecord()).finished
    found = []
    for name, sub in sorted(group[kind].groups()):
        if name.startswith("."):
            continue
        record = read_record(sub, record_type, f"{where}/{kind}/{name}") or record_type()
        if record.made_from != finished:
            warnings.warn(
                f"{where}/{kind}/{name} was scored from features embedded again since: "
                f"left out ({again} the store again)",
                stacklevel=4,
            )
            continue
        found.append((name, sub, record))
    return found


@dataclass(frozen=True)
class LearnedSet:
    """One current learned set of a group: its scores (tile, column), its columns and its
    record."""

    scores: zarr.Array
    columns: list[str]
    record: LearnedRecord


def learned_recipe(tiles: Recipe, record: LearnedRecord) -> Recipe:
    """The recipe of a learned set: its tile features' (`tiles`) and the run that made it
    (its folder, model, task, fold, columns): sets of one name from several stores meet
    only where these are one (`combine`)."""
    run = dict(record.run)
    facts = {k: run.get(k) for k in ("run", "model", "task", "fold") if k in run}
    facts["columns"] = list(record.columns)
    return with_facts(tiles, "learned", facts)


def learned_sets(group: zarr.Group, where: str) -> dict[str, LearnedSet]:
    """A finished embeddings group's current learned sets: {run: LearnedSet}; a set made
    from the group's earlier features left out, with a warning naming it."""
    return {
        name: LearnedSet(sub[SCORES], list(record.columns), record)
        for name, sub, record in _current(group, where, LEARNED, LearnedRecord, "explain")
    }


def read_tile_scores(
    store: str | Path, model: str, name: str, plan: str | None = None
) -> dict[str, Any]:
    """One set as written: {"probabilities": (tile, class), "record": its record}; of the
    model's group of `plan` (None: its only plan's)."""
    path = scores_group_name(find_group(store, model, plan), name)
    where = url_store(store) if is_url(store) else Path(store)  # a URL read where it is
    group = zarr.open_group(where, path=path, mode="r", zarr_format=3)
    record = read_record(group, ScoresRecord, f"{store}: {path}")
    if record is None:
        raise KeyError(f"{path}'s record")
    return {"probabilities": group[PROBABILITIES][:], "record": record.to_attrs()}
