"""What each group in a store says about itself is one typed record per kind
(`tilestore.format.records`): a plan's, an embeddings group's, a slide vector's, a set of
scores', a label's. Written by one function, read and checked once, its attributes what
they were before the records were typed (the keys, their order, their values), kept byte for
byte when read and written back, a fact of the wrong type one error naming the group and the
key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from tilestore.embeddings import embeddings_status, open_embeddings
from tilestore.embeddings.scores import score_sets, write_tile_scores
from tilestore.embeddings.slides import read_slide_vector, read_tile_features, write_slide_vector
from tilestore.errors import DamagedEmbeddings, StoreError
from tilestore.format.records import (
    EmbeddingsRecord,
    GroupRecord,
    LabelRecord,
    PlanRecord,
    ScoresRecord,
    SlideVectorRecord,
    read_record,
    write_record,
)
from tilestore.plan import list_plans
from tilestore.reading.opening import open_slide

MODEL = "efficientnet-lite0"
GROUP = f"embeddings/{MODEL}/classes"
VECTOR = f"{GROUP}/slides/mean-pool"
SCORES = f"{GROUP}/zeroshot/two"

# The keys each kind of record holds, in the order written: as main's code wrote them for
# this run (convert, plan "classes" with ROI classes, embed, a slide vector, scores) before
# the records were typed.
KEYS = {
    "plans/classes": ["uid", "spec", "classes", "qc_classes", "chunk_shape", "params",
                      "recipe", "notes", "tiles", "created", "complete"],
    GROUP: ["model", "batch_size", "dtype", "precision", "compile", "plan", "positions",
            "tiles", "tile_size", "mpp", "level", "read_px", "grid", "classes", "qc_classes",
            "coordinates", "software", "started", "complete", "finished", "run"],
    "labels/tissue": ["method", "polarity", "params", "mpp", "downsample", "source_level",
                      "fraction", "notes"],
    VECTOR: ["encoder", "pooling", "tiles", "dim"],
    SCORES: ["classes", "tower", "logit_scale", "tiles"],
}  # fmt: skip
KINDS = {
    "plans/classes": PlanRecord,
    GROUP: EmbeddingsRecord,
    "labels/tissue": LabelRecord,
    VECTOR: SlideVectorRecord,
    SCORES: ScoresRecord,
}


@pytest.fixture
def made(tmp_path, embedded_cohort) -> Path:
    """A copy of the embedded CMU store with a slide vector and a set of scores written."""
    store = tmp_path / embedded_cohort[0].name
    shutil.copytree(embedded_cohort[0], store)
    tiles = read_tile_features(store, MODEL, "classes")
    vector = tiles.features.mean(axis=0)
    write_slide_vector(tiles, "mean-pool", vector, {"encoder": "mean-pool", "pooling": "mean"})
    probabilities = np.full((len(tiles.features), 2), 0.5, np.float32)
    record = {"classes": ["a", "b"], "tower": "x", "logit_scale": 1.0}
    made = {"finished": tiles.finished, "tiles": len(probabilities)}
    write_tile_scores(store, tiles.path, "two", probabilities, record, made)
    return store


def _raw(store: Path, path: str) -> dict:
    return json.loads((store / path / "zarr.json").read_text())["attributes"]["tilestore"]


def test_each_record_holds_the_keys_written_before_in_their_order(made):
    for path, keys in KEYS.items():
        assert list(_raw(made, path)) == keys, path
    plan, group = _raw(made, "plans/classes"), _raw(made, GROUP)
    assert plan["classes"] == ["", "Stroma", "Tumor"] and plan["tiles"] == 45
    assert plan["chunk_shape"] == [240, 240] and plan["qc_classes"] == []
    assert plan["complete"] is True
    assert group["plan"] == {"name": "classes", "uid": plan["uid"]}
    run = [group[k] for k in ("batch_size", "dtype", "precision", "compile")]
    assert run == [16, "float32", "fp32", False]
    assert [group[k] for k in ("tiles", "tile_size", "read_px", "level")] == [45, 224, 224, 0]
    assert group["mpp"] == 0.499 and group["complete"] is True
    assert group["model"]["name"] == MODEL and group["model"]["output_dim"] == 1280
    label = _raw(made, "labels/tissue")
    said = [label[k] for k in ("method", "polarity", "mpp", "source_level")]
    assert said == ["otsu", "bright background", 8.0, 2]
    vector = _raw(made, VECTOR)
    assert vector["dim"] == 1280 and vector["encoder"] == "mean-pool"
    assert list(vector["tiles"]) == ["model", "plan", "tiles", "finished", "mpp", "tile_size",
                                     "footprint0"]  # fmt: skip
    assert vector["tiles"]["finished"] == group["finished"]
    scored = {"finished": group["finished"], "tiles": 45}
    assert _raw(made, SCORES) == {"classes": ["a", "b"], "tower": "x", "logit_scale": 1.0,
                                  "tiles": scored}  # fmt: skip


def test_a_record_read_and_written_back_is_byte_for_byte_what_it_was(made):
    for path, kind in KINDS.items():
        file = made / path / "zarr.json"
        before = file.read_bytes()
        group = zarr.open_group(made, path=path, mode="r+")
        record = read_record(group, kind)
        assert isinstance(record, kind)
        write_record(group, record)
        assert file.read_bytes() == before, path


def test_the_fields_say_what_the_attributes_say(made):
    group = read_record(zarr.open_group(made, path=GROUP), EmbeddingsRecord)
    raw = _raw(made, GROUP)
    assert group.complete and group.finished == raw["finished"]
    assert (group.plan_name, group.plan_uid) == ("classes", raw["plan"]["uid"])
    assert (group.model_name, group.tiles, group.batch_size) == (MODEL, 45, 16)
    assert group.dtype == "float32"
    plan = read_record(zarr.open_group(made, path="plans/classes"), PlanRecord)
    assert plan.uid == raw["plan"]["uid"] and plan.classes == ("", "Stroma", "Tumor")
    vector = read_record(zarr.open_group(made, path=VECTOR), SlideVectorRecord)
    assert vector.dim == 1280 and vector.made_from == raw["finished"]
    scores = read_record(zarr.open_group(made, path=SCORES), ScoresRecord)
    assert scores.classes == ("a", "b") and scores.made_from == raw["finished"]
    label = read_record(zarr.open_group(made, path="labels/tissue"), LabelRecord)
    assert label.downsample == tuple(_raw(made, "labels/tissue")["downsample"])


def test_a_fact_no_record_names_is_kept_in_its_place():
    record = EmbeddingsRecord.parse(
        {"model": {"name": "m"}, "newer": [1, 2], "complete": False}, "here"
    )
    done = record.replace(complete=True, finished="now")
    assert list(done.to_attrs()) == ["model", "newer", "complete", "finished"]
    assert done.to_attrs()["newer"] == [1, 2] and done.complete and done.finished == "now"


def _damage(store: Path, path: str, **facts) -> None:
    group = zarr.open_group(store, path=path, mode="r+")
    write_record(group, GroupRecord.parse({**_raw(store, path), **facts}, path))


def test_a_plan_record_of_the_wrong_type_is_one_store_error_naming_the_plan_and_key(made):
    _damage(made, "plans/classes", tiles="many")
    with pytest.raises(StoreError, match=r"plan 'classes'.*tiles is 'many', not an integer"):
        list_plans(open_slide(made))


@pytest.mark.parametrize(("key", "value"), [("plan", "classes"), ("batch_size", [16])])
def test_an_embeddings_record_of_the_wrong_type_is_refused_naming_the_key(made, key, value):
    _damage(made, GROUP, **{key: value})
    with pytest.raises(DamagedEmbeddings, match=rf"{GROUP}: its embeddings group record is "
                       rf"damaged \(TypeError: {key} is") as refused:  # fmt: skip
        open_embeddings([made], MODEL)
    assert str(made) in str(refused.value) and "\n" not in str(refused.value)
    (found,) = embeddings_status(made, MODEL).groups
    assert found.state == "damaged" and f"{key} is" in found.note


def test_a_slide_vector_record_of_the_wrong_type_is_refused_naming_the_key(made):
    _damage(made, VECTOR, dim="wide")
    with pytest.raises(DamagedEmbeddings, match=r"slides/mean-pool: its slide embedding "
                       r"record is damaged \(ValueError: dim is 'wide'"):  # fmt: skip
        read_slide_vector(made, MODEL, "mean-pool")


def test_a_scores_record_of_the_wrong_type_is_refused_naming_the_key(made):
    _damage(made, SCORES, classes="a,b")
    group = zarr.open_group(made, path=GROUP)
    with pytest.raises(StoreError, match=r"zeroshot/two: its scores record is damaged "
                       r"\(TypeError: classes is str, not a list\)"):  # fmt: skip
        score_sets(group, f"{made}: {GROUP}")
