"""`reshard`: a store of one file per chunk (the layout before shards) rewritten into shards:
every chunk's bytes kept as they were, every reader reads the same, a failure leaves the old
store, a store being embedded is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec

from tests.conftest import CMU, group_of
from tilestore.conversion import reshard
from tilestore.embeddings import EmbeddingWriter, RunIdentity
from tilestore.errors import ChunkError, StoreError
from tilestore.format import shards as shards_module
from tilestore.format.codecs import zstd_codecs
from tilestore.format.shards import ShardIndex
from tilestore.plan import PlanOptions, plan_over_tissue, save_plan
from tilestore.reading import verify_store
from tilestore.reading.opening import open_slide

MODEL = {"name": "old-model", "output_dim": 6}
BATCH = 4


def _old_store(store):
    """CMU-1-Small-Region converted one file per chunk, with a plan and an unfinished
    embeddings group laid out as before shards (features a file per batch, done per flag)."""
    path = store(CMU, shard="off")
    slide = open_slide(path)
    plan = plan_over_tissue(slide, PlanOptions(mpp=1.0, tile=224, min_tissue=0.0))
    uid = save_plan(slide, plan)
    n, blocks = len(plan), -(-len(plan) // BATCH)
    group = slide.writable_group().require_group("embeddings/old-model")
    for name in ("x", "y"):
        group.create_array(
            name, data=getattr(plan, name), chunks=(8,), dimension_names=("tile",), **zstd_codecs()
        )
    features = group.create_array(
        "features",
        shape=(n, 6),
        chunks=(BATCH, 6),
        dtype="float32",
        fill_value=np.nan,
        dimension_names=("tile", "feature"),
        **zstd_codecs(level=1),
    )
    done = group.create_array(
        "done",
        shape=(blocks,),
        chunks=(1,),
        dtype="uint8",
        fill_value=0,
        dimension_names=("batch",),
        compressors=[Crc32cCodec()],
    )
    rng = np.random.default_rng(0)
    values = rng.standard_normal((n, 6)).astype("float32")
    for b in (0, 1, 3):  # an interrupted run: three batches done
        features[b * BATCH : (b + 1) * BATCH] = values[b * BATCH : (b + 1) * BATCH]
        done[b] = 1
    identity = RunIdentity(
        MODEL, batch_size=BATCH, dtype="float32", precision="fp32", compile=False
    )
    group.attrs["tilestore"] = {
        **identity.record(),
        "plan": {"name": plan.name, "uid": uid},
        "complete": False,
    }
    return path, plan, uid, identity, values


def _chunk_files(array_dir):
    return {
        p.relative_to(array_dir).as_posix(): p.read_bytes()
        for p in (array_dir / "c").rglob("*")
        if p.is_file()
    }


def _files(path) -> int:
    return sum(len(names) for _, _, names in os.walk(path))


def test_every_chunk_becomes_an_inner_chunk_byte_for_byte(store):
    path, *_ = _old_store(store)
    old = {name: _chunk_files(path / name) for name in ("0", "1", "2")}
    before = _files(path)
    report = reshard(path)
    assert report.arrays >= 5 and report.files_before == before
    assert report.files_after == _files(path) < before / 4
    root = zarr.open_group(path, mode="r")
    for name, chunks in old.items():
        array = root[name]
        assert array.shards is not None and array.chunks == (3, 240, 240)
        index = ShardIndex(array, path / name, str(path))
        for key, data in chunks.items():  # c/0/<row>/<col>: the level's JPEG tiles
            coords = np.array([[int(k) for k in key.split("/")[1:]]])
            (location,) = index.locate(coords)
            with open(location.path, "rb") as fh:
                fh.seek(location.offset)
                assert fh.read(location.length) == data


def test_every_reader_reads_the_same_after(store, cmu_pixels):
    path, plan, _, _, values = _old_store(store)
    slide = open_slide(path)
    region = slide.read_region(37, 91, 1500, 1100, level=0)
    small = slide.read_region(0, 0, 300, 200, level=2)
    reshard(path)
    again = open_slide(path)
    assert np.array_equal(again.read_region(37, 91, 1500, 1100, level=0), region)
    assert np.array_equal(again.read_region(0, 0, 300, 200, level=2), small)
    assert np.array_equal(again.to_dask(0).compute().transpose(1, 2, 0)[91:1191, 37:1537], region)
    group = zarr.open_group(path / group_of(path, "old-model"), mode="r")
    assert group["features"].shards == (4096, 6) and group["done"].shards == (1024,)
    assert group["done"][:4].tolist() == [1, 1, 0, 1]
    np.testing.assert_array_equal(group["features"][:8], values[:8])
    assert np.isnan(group["features"][8:12]).all()
    assert np.array_equal(group["x"][:], plan.x)
    result = verify_store(path)
    assert result.ok and not result.unchecked


def test_an_unfinished_embedding_resumes_after_resharding(store):
    path, plan, uid, identity, values = _old_store(store)
    reshard(path)
    writer = EmbeddingWriter(open_slide(path), plan, uid, identity, create=False)
    assert writer.todo().tolist()[:2] == [2, 4]  # batches 0, 1 and 3 stay done
    for b in writer.todo():
        writer.write(int(b), values[b * BATCH : (b + 1) * BATCH])
    writer.finish({})
    group = zarr.open_group(path / group_of(path, "old-model"), mode="r")
    assert group.attrs["tilestore"]["complete"]
    np.testing.assert_array_equal(group["features"][:], values)


def test_a_failure_midway_leaves_the_old_store_as_it_was(store, monkeypatch):
    path, *_ = _old_store(store)
    before = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
    written = []

    def fails_on_the_third(target, data):
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        written.append(target)
        real(target, data)

    real = shards_module.write_atomic
    monkeypatch.setattr("tilestore.conversion.resharding.write_atomic", fails_on_the_third)
    with pytest.raises(StoreError, match=r"cannot reshard: .*No space left"):
        reshard(path)
    assert {p: p.read_bytes() for p in path.rglob("*") if p.is_file()} == before
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("kind", ["link", "folder"])
def test_a_damaged_chunk_file_is_refused_not_packed(store, kind):
    """A chunk file that is a link to another chunk (valid pixels in the wrong place) or a
    folder is damage: packed into a shard it could no longer be told apart, so resharding
    stops with its name and leaves the store as it was."""
    path, *_ = _old_store(store)
    chunk = path / "0" / "c" / "0" / "2" / "3"
    chunk.unlink()
    if kind == "link":
        chunk.symlink_to(path / "0" / "c" / "0" / "0" / "0")
    else:
        chunk.mkdir()
    before = sorted(p.relative_to(path) for p in path.rglob("*"))
    with pytest.raises(ChunkError, match=r"chunk \(0, 2, 3\): chunk is (a symbolic link|a folder)"):
        reshard(path)
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


def test_a_store_being_embedded_is_refused(store):
    path, *_ = _old_store(store)
    lock = path.parent / f".{path.name}.old-model.lock"
    lock.write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    with pytest.raises(StoreError, match=r"writing into it \(pid 1 on elsewhere since \?, "
                       r"\.[^ ]*\.old-model\.lock\); resharding it is refused"):  # fmt: skip
        reshard(path)
    assert (path / "0" / "c" / "0" / "0" / "0").is_file()  # untouched


def test_a_store_already_in_shards_is_left_untouched(store):
    path = store(CMU)
    stamps = {p: p.stat().st_mtime_ns for p in path.rglob("*")}
    report = reshard(path)
    assert report.arrays == 0 and report.files_after == report.files_before
    assert {p: p.stat().st_mtime_ns for p in path.rglob("*")} == stamps


def test_not_a_store_is_one_line(tmp_path):
    with pytest.raises(StoreError, match="no such store"):
        reshard(tmp_path / "missing.ome.zarr")


def test_cli_reshards_and_says_what_it_did(store):
    path, *_ = _old_store(store)
    run = subprocess.run(
        [sys.executable, "-m", "tilestore.cli", "reshard", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert run.returncode == 0, run.stderr
    assert "arrays into shards" in run.stdout and " -> " in run.stdout
    assert zarr.open_array(path / "0", mode="r").shards is not None


def test_the_older_jpeg_codec_is_declared_as_imagecodecs_jpeg(store):
    path, *_ = _old_store(store)
    region = open_slide(path).read_region(0, 0, 700, 500, level=0)
    for level, space in (("0", "rgb"), ("1", "ycbcr")):  # as stores before this change said it
        meta = json.loads((path / level / "zarr.json").read_text())
        meta["codecs"][1] = {
            "name": "jpeg",
            "configuration": {
                "quality": 95,
                "encoded_color_space": space,
                "subsampling": [[1, 1]] * 3,
            },
        }
        (path / level / "zarr.json").write_text(json.dumps(meta))
    assert np.array_equal(open_slide(path).read_region(0, 0, 700, 500, level=0), region)
    reshard(path)
    for level, space in (("0", "RGB"), ("1", "YCbCr")):
        meta = json.loads((path / level / "zarr.json").read_text())
        (inner,) = [c for c in meta["codecs"][0]["configuration"]["codecs"] if "jpeg" in c["name"]]
        assert inner == {
            "name": "imagecodecs_jpeg",
            "configuration": {
                "level": 95,
                "colorspace_data": "RGB",
                "colorspace_jpeg": space,
                "subsampling": "444",
            },
        }
    assert np.array_equal(open_slide(path).read_region(0, 0, 700, 500, level=0), region)
