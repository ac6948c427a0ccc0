"""Embeddings tied to their positions (`tilestore.embeddings.tied`): chunks moved, swapped,
deleted or rewritten since they were written are refused by every reader at the group's door,
called damaged by `status` and the writer (never complete, never resumed; overwrite=True makes
the group again) and listed by `verify`. Groups written by `EmbeddingWriter` into a real store
(CMU-1-Small-Region), shards of 4 batches of 4 tiles, then damaged on disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
import zarr

from tilestore.embeddings import (
    EmbeddingWriter,
    RunIdentity,
    embeddings_status,
    open_embeddings,
    read_tile_features,
    resume_state,
)
from tilestore.embeddings import tied as tied_module
from tilestore.errors import DamagedEmbeddings, EmbeddingError, StoreError
from tilestore.format import positions
from tilestore.format.shards import ENTRY, TRAILER
from tilestore.plan import PlanOptions, plan_over_tissue, save_plan
from tilestore.reading import verify_store
from tilestore.reading.opening import open_slide

MODEL = {"name": "m", "output_dim": 4}
GROUP = "embeddings/m/1mpp-112px-t0"  # embeddings/<model>/<plan>
AGAIN = "pass overwrite=True to embed again"


def _identity() -> RunIdentity:
    return RunIdentity(MODEL, 4, "float32", "fp32", False, shard_tiles=16)


@pytest.fixture
def made(store):
    """A store whose group of `m` is complete: (store, plan, uid, features written)."""
    path = store()
    slide = open_slide(path)
    plan = plan_over_tissue(slide, PlanOptions(mpp=1.0, tile=112, min_tissue=0.0))
    uid = save_plan(slide, plan)
    features = np.random.default_rng(0).standard_normal((len(plan), 4)).astype(np.float32)
    _write(path, plan, uid, features)
    return path, plan, uid, features


def _write(path, plan, uid, features, overwrite: bool = False) -> None:
    writer = EmbeddingWriter(open_slide(path), plan, uid, _identity(), overwrite=overwrite)
    for block in writer.todo():
        writer.write(int(block), features[block * 4 : (block + 1) * 4])
    writer.finish({})


def test_every_array_records_what_its_chunks_end_with_by_position(made):
    path, plan, _, _ = made
    group = zarr.open_group(path / GROUP, mode="r")
    declared = group.attrs["tilestore"]["positions"]["arrays"]
    columns = ["col", "roi", "roi_class", "row", "tissue", "x", "x_um", "y", "y_um"]
    assert sorted(declared) == sorted([*columns, "done", "features"])
    assert declared["features"] == "float32" and declared["x"] == "int64"
    attrs = group.attrs["tilestore"]
    assert sorted(attrs["positions"]["columns"]) == columns  # a column's in the record
    for name in declared:
        array = group[name]
        recorded = positions.group_positions(attrs, name, array, name).table()
        np.testing.assert_array_equal(recorded, positions.read_back(array, name))
        if name in ("features", "done"):  # every chunk written: a complete group's
            assert (recorded != positions.UNWRITTEN).all()
    assert sorted(p.name for p in (path / GROUP / "crc32c").iterdir()) == [
        "done",
        "features",
        "zarr.json",
    ]
    shards = -(-len(plan) // 16)
    assert shards >= 6
    # a file for each shard of the batched arrays: no two writers ever write one
    record = path / GROUP / "crc32c" / "features" / "c"
    assert len([p for p in record.rglob("*") if p.is_file()]) == shards
    done = zarr.open_array(path / GROUP / "crc32c" / "done", mode="r")[:]
    assert (done == google_crc32c.value(b"\x01")).all()  # the flag's chunk, from bytes in hand


def _swap_files(path: Path) -> str:
    """features' shard files 1 and 2 renamed into each other's place (--shard-tiles 16)."""
    a, b = path / GROUP / "features/c/1/0", path / GROUP / "features/c/2/0"
    tmp = a.with_name("swap")
    a.rename(tmp), b.rename(a), tmp.rename(b)
    return "features: rows 16-47 are not as written (8 chunks not those written there"


def _swap_entries(path: Path) -> str:
    """Two entries of features shard 0's index swapped, its CRC-32C made right again."""
    shard = path / GROUP / "features/c/0/0"
    data = bytearray(shard.read_bytes())
    chunks = 4
    start = len(data) - chunks * ENTRY - TRAILER
    index = np.frombuffer(bytes(data[start : len(data) - TRAILER]), "<u8").reshape(chunks, 2)
    index = index[[1, 0, 2, 3]].copy()
    table = index.tobytes()
    data[start:] = table + google_crc32c.value(table).to_bytes(4, "little")
    shard.write_bytes(bytes(data))
    return "features: rows 0-7 are not as written (2 chunks not those written there"


def _swap_columns(path: Path) -> str:
    """The x and y columns' files (both int64, one shard each) swapped."""
    x, y = path / GROUP / "x/c/0", path / GROUP / "y/c/0"
    data = x.read_bytes()
    x.write_bytes(y.read_bytes()), y.write_bytes(data)
    return "/x: rows 0-"


def _deleted(path: Path) -> str:
    (path / GROUP / "features/c/3/0").unlink()
    return "features: rows 48-63 are not as written (4 chunks missing where written)"


def _nan(path: Path) -> str:
    zarr.open_array(path / GROUP / "features", mode="r+")[21, 2] = np.nan
    return "features: rows 20-23 are not as written (1 chunk not those written there"


def _dtype(path: Path) -> str:
    meta = path / GROUP / "features" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["data_type"] = "float64"  # its chunks unchanged: their positions cannot tell
    meta.write_text(json.dumps(doc))
    return "features is float64 where the group records float32: its zarr.json was changed"


DAMAGE = [_swap_files, _swap_entries, _swap_columns, _deleted, _nan, _dtype]


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_group_not_as_written_is_refused_by_readers_status_and_the_writer(made, damage):
    path, plan, uid, features = made
    said = damage(path)
    where = f"{path}: {GROUP}"
    with pytest.raises(DamagedEmbeddings) as caught:  # every reader: one line, at the door
        open_embeddings(path, "m")
    message = str(caught.value)
    assert message.startswith(where) and said in message and "\n" not in message
    with pytest.raises(DamagedEmbeddings, match="it is damaged; embed the store again"):
        read_tile_features(path, "m")
    group = embeddings_status(path, "m").groups[0]  # never complete
    assert (group.state, group.note) == ("damaged", message)
    found = resume_state(open_slide(path), "m", plan.name, uid, len(plan))
    assert found.state == "damaged" and said in found.why and found.why.endswith(AGAIN)
    with pytest.raises(EmbeddingError) as refused:  # embed neither skips nor resumes it
        EmbeddingWriter(open_slide(path), plan, uid, _identity())
    assert str(refused.value) == found.why
    verified = verify_store(path)
    assert not verified.ok and any(f"{GROUP}/" in line for line in verified.bad)
    _write(path, plan, uid, features, overwrite=True)  # made again: read as written
    np.testing.assert_array_equal(open_embeddings(path, "m").features.values, features)
    assert embeddings_status(path, "m").groups[0].state == "complete"


def test_a_damaged_record_of_positions_is_damage(made):
    path = made[0]
    shutil.rmtree(path / GROUP / "crc32c" / "features")
    with pytest.raises(StoreError, match=r"features: its chunk positions \(.*\) are missing"):
        open_embeddings(path, "m")
    assert embeddings_status(path, "m").groups[0].state == "damaged"


def _column_records(path: Path, damage) -> None:
    """The group's record with its columns' positions changed by `damage` (name, table)."""
    group = zarr.open_group(path / GROUP, mode="r+")
    attrs = json.loads(json.dumps(group.attrs["tilestore"]))
    damage(attrs["positions"]["columns"])
    group.attrs["tilestore"] = attrs


_DAMAGED = "x: its chunk positions (in its group's record) are damaged"


def _one_crc_changed(columns: dict) -> None:
    columns["y"][0] ^= 1


@pytest.mark.parametrize(
    "damage, said",
    [
        (_one_crc_changed, "/y: rows 0-"),
        (lambda c: c.update(x=[]), _DAMAGED),
        (lambda c: c.update(x=["a"]), _DAMAGED),
        (lambda c: c.update(x=[2**40]), _DAMAGED),
        (lambda c: c.update(x=None), _DAMAGED),
        (lambda c: c.update(x=5), _DAMAGED),
        (lambda c: c.update(x={}), _DAMAGED),
    ],
)
def test_a_column_position_in_the_record_not_as_written_is_damage(made, damage, said):
    """A column's positions are in its group's record: one changed is a column not as
    written; one not a CRC-32C a chunk is a damaged record; each one line at every door."""
    path = made[0]
    _column_records(path, damage)
    with pytest.raises(StoreError) as caught:
        open_embeddings(path, "m")
    assert said in str(caught.value) and "\n" not in str(caught.value)
    assert embeddings_status(path, "m").groups[0].state == "damaged"
    verified = verify_store(path)
    named = said if "damaged" in said else f"{GROUP}/y chunk (0,): chunk is not the one written"
    assert not verified.ok and any(named in line for line in verified.bad)


def test_a_group_whose_columns_positions_are_files_reads_as_before(made):
    """A group made before its record held its columns' positions has them as files
    (``crc32c/<column>``, as its batched arrays'): read there, columns swapped found."""
    path, _, _, features = made
    group = zarr.open_group(path / GROUP, mode="r+")
    attrs = json.loads(json.dumps(group.attrs["tilestore"]))
    for name in attrs["positions"].pop("columns"):
        positions.record(group[name], positions.read_back(group[name], name))
    group.attrs["tilestore"] = attrs
    assert (path / GROUP / "crc32c" / "x" / "zarr.json").exists()
    np.testing.assert_array_equal(open_embeddings(path, "m").features.values, features)
    assert verify_store(path).ok
    said = _swap_columns(path)
    with pytest.raises(DamagedEmbeddings, match=said):
        open_embeddings(path, "m")
    shutil.rmtree(path / GROUP / "crc32c" / "y")
    assert embeddings_status(path, "m").groups[0].state == "damaged"


def test_a_group_made_before_positions_reads_as_before_and_says_not_tied(made):
    path, _, _, features = made
    group = zarr.open_group(path / GROUP, mode="r+")
    attrs = dict(group.attrs["tilestore"])
    del attrs["positions"]
    group.attrs["tilestore"] = attrs
    shutil.rmtree(path / GROUP / "crc32c")
    np.testing.assert_array_equal(open_embeddings(path, "m").features.values, features)
    found = embeddings_status(path, "m").groups[0]
    assert found.state == "complete" and found.tied is False and "not tied" in found.note
    verified = verify_store(path)
    assert verified.ok
    assert verified.untied_groups == [f"{GROUP} (made before positions were recorded)"]
    _swap_files(path)  # unseen: what positions are for
    assert embeddings_status(path, "m").groups[0].state == "complete"
    _deleted(path)  # a complete group wrote every features chunk: one missing is damage
    with pytest.raises(DamagedEmbeddings, match="missing where written"):
        open_embeddings(path, "m")
    assert embeddings_status(path, "m").groups[0].state == "damaged"


class Killed(Exception):
    pass


@pytest.mark.parametrize("when", ["before positions", "before flags"])
def test_a_kill_between_a_shard_and_its_positions_or_flags_resumes_to_the_same_group(
    made, store, monkeypatch, when
):
    """Killed after a shard's features are written but before their positions are (or after
    the positions, the flags' among them, before the flags): the batches are not done, the
    group resumes (not damaged), and ends bitwise as a run never killed."""
    _, plan, _, features = made
    path = store(into=made[0].parent / "again")
    slide = open_slide(path)
    uid = save_plan(slide, plan)
    writer = EmbeddingWriter(slide, plan, uid, _identity())
    for block in range(4):  # shard 0, whole
        writer.write(block, features[block * 4 : (block + 1) * 4])
    original = tied_module.Recorder.shard

    def dies(self, shard, first, flags):
        if when == "before flags":
            original(self, shard, first, flags)
        raise Killed

    monkeypatch.setattr(tied_module.Recorder, "shard", dies)
    with pytest.raises(Killed):
        for block in range(4, 8):  # shard 1: written, then killed
            writer.write(block, features[block * 4 : (block + 1) * 4])
    monkeypatch.undo()
    writer._release_lock()
    found = resume_state(open_slide(path), "m", plan.name, uid, len(plan))
    assert found.state == "resumes" and found.done.tolist() == [0, 1, 2, 3], found.why
    assert embeddings_status(path, "m").groups[0].state == "partial"
    _write(path, plan, uid, features)
    np.testing.assert_array_equal(open_embeddings(path, "m").features.values, features)
    done = zarr.open_group(path / GROUP, mode="r")
    assert json.dumps(done.attrs["tilestore"]["positions"]) == json.dumps(
        zarr.open_group(made[0] / GROUP, mode="r").attrs["tilestore"]["positions"]
    )
    for name in ("features", "done"):  # the records as a run never killed left them
        np.testing.assert_array_equal(
            positions.Positions(done[name], name).table(),
            positions.Positions(zarr.open_group(made[0] / GROUP, mode="r")[name], name).table(),
        )


def test_a_partial_group_whose_done_batches_moved_is_damaged_not_resumed(made):
    path, plan, uid, _ = made
    group = zarr.open_group(path / GROUP, mode="r+")
    group.attrs["tilestore"] = {**group.attrs["tilestore"], "complete": False}
    _swap_files(path)
    found = resume_state(open_slide(path), "m", plan.name, uid, len(plan))
    assert found.state == "damaged" and "rows 16-47 are not as written" in found.why
    assert embeddings_status(path, "m").groups[0].state == "damaged"
    with pytest.raises(EmbeddingError, match=AGAIN):
        EmbeddingWriter(open_slide(path), plan, uid, _identity())
