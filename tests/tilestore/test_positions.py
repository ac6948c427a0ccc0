"""Chunks tied to their positions: a chunk whole but in another chunk's place (a shard index
with entries swapped, its CRC-32C made right; two chunk files renamed into each other's
place) is named by `verify`, with and without decoding, and by every read; stores made
before positions were recorded read and verify as they did, and say they are not tied."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import CMU
from tests.counting import CountingStore
from tilestore.conversion import open_in_place, reshard
from tilestore.conversion.converter import convert
from tilestore.embed.procdecode import ProcessDecoder
from tilestore.errors import ChunkError
from tilestore.format import positions
from tilestore.format.integrity import UNWRITTEN, Located, seal
from tilestore.format.shards import index_bytes
from tilestore.reading.labels import read_label, write_label
from tilestore.reading.opening import open_slide
from tilestore.reading.verify import verify_store

MOVED = "chunk is not the one written here"


def swap_entries(shard: Path, entries: int, a: int, b: int) -> None:
    """Swap entries `a` and `b` of a shard's index (of `entries`) and seal the index again
    with its CRC-32C, as a tool rewriting the index would: every chunk and the index whole."""
    data = shard.read_bytes()
    body = len(data) - index_bytes(entries)
    table = np.frombuffer(data, "<u8", 2 * entries, body).reshape(-1, 2).copy()
    table[[a, b]] = table[[b, a]]
    shard.write_bytes(data[:body] + seal(table.tobytes()))


def permute_entries(shard: Path, entries: int, order: list[int]) -> None:
    """Entry i of a shard's index becomes entry order[i], the index sealed again."""
    data = shard.read_bytes()
    body = len(data) - index_bytes(entries)
    table = np.frombuffer(data, "<u8", 2 * entries, body).reshape(-1, 2)
    shard.write_bytes(data[:body] + seal(table[order].tobytes()))


def untie(store: Path) -> None:
    """Make `store` one from before positions: their arrays and the attribute gone."""
    for folder in store.rglob(positions.GROUP):
        shutil.rmtree(folder)
    meta = store / "zarr.json"
    doc = json.loads(meta.read_text())
    del doc["attributes"]["tilestore"]["integrity"]["positions"]
    meta.write_text(json.dumps(doc))


def test_a_shard_index_with_two_entries_swapped_is_named_by_verify_and_every_read(store):
    """The report: two entries of level 2's index swapped, its CRC-32C recomputed. Every chunk
    and the index are whole, and before, verify and verify --decode said all good while
    75,600 px of level 2 differed from the slide."""
    path = store()
    assert json.loads((path / "zarr.json").read_text())["attributes"]["tilestore"]["integrity"][
        "positions"
    ].startswith("crc32c/<level> beside each level")
    swap_entries(path / "2" / "c" / "0" / "0" / "0", 12, 4, 5)  # chunks (1, 1) and (1, 2)
    for decode in (False, True):
        result = verify_store(path, decode=decode)
        assert result.bad == [
            f"{path}: level 2 chunk (0, 1, {col}): {MOVED} (its CRC-32C is not the one "
            "recorded for this position: moved, swapped or its shard index rewritten)"
            for col in (1, 2)
        ]
        assert result.untied == []
    for slide in (open_slide(path), open_slide(CountingStore.local(path))):  # files, ranges
        with pytest.raises(ChunkError, match=rf"level 2 chunk \(1, 1\): {MOVED}"):
            slide.read_region(0, 0, 555, 742, level=2)
        assert slide.read_region(0, 0, 240, 240, level=2).shape == (240, 240, 3)  # (0, 0) ok


def test_the_decoder_processes_name_a_chunk_out_of_place(store):
    """The engine's decoder processes get each chunk's recorded CRC-32C with its location
    (through their JSON requests) and refuse it as `read_region` does."""
    path = store()
    swap_entries(path / "0" / "c" / "0" / "0" / "0", 130, 0, 1)  # chunks (0, 0) and (0, 1)
    reader = open_slide(path).chunks(0)
    coords = [(0, c) for c in range(reader.grid[1])]
    shape = (reader.chunk_h, reader.chunk_w, reader.channels)
    decoder = ProcessDecoder(1)
    try:
        decoder.reserve(1, len(coords) * math.prod(shape))
        _, done = decoder.submit(
            Located.of(reader.locations(coords)),
            coords,
            shape,
            reader.background,
            threading.Event(),
            checksum=reader.checksum,
            required=reader.every_chunk,
            where=reader.where,
            colorspace=reader.jpeg_colorspace,
        )
        with pytest.raises(ChunkError, match=rf"level 0 chunk \(0, 0\): {MOVED}"):
            done[0].result(timeout=60)
    finally:
        decoder.close()


def test_two_chunk_files_swapped_are_named_in_a_store_of_one_file_per_chunk(store):
    """convert(shard="off") writes a file per chunk: two renamed into each other's place."""
    path = store(shard="off")
    first, second = path / "0" / "c" / "0" / "3" / "4", path / "0" / "c" / "0" / "3" / "5"
    first.rename(path / "moving")
    second.rename(first)
    (path / "moving").rename(second)
    for decode in (False, True):
        bad = verify_store(path, decode=decode).bad
        assert [line.split(": ")[1] for line in bad] == [
            "level 0 chunk (0, 3, 4)",
            "level 0 chunk (0, 3, 5)",
        ]
        assert all(MOVED in line for line in bad)
    with pytest.raises(ChunkError, match=rf"level 0 chunk \(3, 4\): {MOVED}"):
        open_slide(path).read_region(960, 720, 480, 240, level=0)


def test_a_chunk_moved_into_a_sidecars_built_level_is_named(slide_path, tmp_path):
    """A sidecar's levels read in place are the slide's tiles (tied by its fingerprint); its
    built levels are ours, in shards read through the sidecar's store: tied as any."""
    slide = tmp_path / "slide.svs"
    shutil.copyfile(slide_path(CMU), slide)
    open_in_place(slide, tmp_path / "side")
    sidecar = tmp_path / "side" / "slide.svs.tilestore.zarr"
    assert not (sidecar / positions.path_of("0")).exists()  # the slide's: none recorded
    assert verify_store(sidecar, decode=True).ok
    swap_entries(sidecar / "1" / "c" / "0" / "0" / "0", 35, 0, 6)  # (0, 0) and (1, 1)
    with pytest.raises(ChunkError, match=rf"level 1 chunk \(0, 0\): {MOVED}"):
        open_slide(sidecar).read_region(0, 0, 240, 240, level=1)
    assert len(verify_store(sidecar).bad) == 2


def test_a_lossless_level_is_tied_plane_by_plane(tmp_path):
    """A zstd level read through zarr, 5 channels in chunks of one plane: each chunk of each
    plane is tied to its place before zarr decodes it."""
    pixels = np.random.default_rng(0).integers(0, 60000, (5, 600, 700), np.uint16)
    source = tmp_path / "five.ome.tif"
    tifffile.imwrite(source, pixels, ome=True, tile=(256, 256), metadata={"axes": "CYX"})
    path = convert(source, tmp_path / "out", mpp=0.5).store
    assert zarr.open_array(path / "0", mode="r").chunks == (1, 256, 256)
    swap_entries(path / "0" / "c" / "3" / "0" / "0", 9, 0, 1)  # plane 3, (0, 0) and (0, 1)
    slide = open_slide(path)
    with pytest.raises(ChunkError, match=rf"level 0 chunk \(3, 0, 0\): {MOVED}"):
        slide.read_region(0, 0, 300, 200, level=0)
    assert [line.split(": ")[1] for line in verify_store(path).bad] == [
        "level 0 chunk (3, 0, 0)",
        "level 0 chunk (3, 0, 1)",
    ]


def test_a_label_level_is_tied_to_its_positions(store):
    """A label written into a store that records positions gets its own (`write_label`):
    entries swapped, or a chunk moved where none was written (a class absent there), are
    named by `read_label` and by verify."""
    path = store()
    slide = open_slide(path)
    label = np.zeros((2967, 2220), np.uint8)
    label[:1024, :2048] = np.arange(2048, dtype=np.uint16)[None] // 1024 + 1  # chunks (0, 0-1)
    label[1024:2048, :1024] = 3  # chunk (1, 0); (1, 1) and the others: 0, absent
    write_label(slide, "test", label, (1.0, 1.0), [("none", (0, 0, 0, 0))], {"n": 1}, "nearest")
    assert np.array_equal(read_label(open_slide(path), "test", lambda a, _: a), label)
    assert verify_store(path).ok
    shard = path / "labels" / "test" / "0" / "c" / "0" / "0" / "0"
    original = shard.read_bytes()
    swap_entries(shard, 9, 0, 1)  # (0, 0) and (0, 1): both written
    with pytest.raises(ChunkError, match=rf"level labels/test/0 chunk \(0, 0\): {MOVED}"):
        read_label(open_slide(path), "test", lambda a, _: a)
    assert len(verify_store(path).bad) == 2
    shard.write_bytes(original)
    swap_entries(shard, 9, 3, 4)  # (1, 0) written, (1, 1) absent: swapped
    with pytest.raises(ChunkError, match=r"chunk \(1, 0\): chunk is missing"):  # the first
        read_label(open_slide(path), "test", lambda a, _: a)
    bad = verify_store(path).bad
    assert "labels/test/0 chunk (0, 1, 0): chunk is missing (one was written here)" in bad[0]
    assert "(0, 1, 1): a chunk is stored where none was written (moved here?)" in bad[1]


def test_a_label_a_killed_writer_left_unlisted_is_absent_and_written_again(store):
    """A process killed while writing a label (a requeued SLURM task's preparation: seen in
    CI) leaves its group half made and unlisted, its chunks not matching its positions:
    read as absent (its resume computes it again, it failed on the damage), then replaced
    by `write_label`; a listed label damaged the same way is still refused."""
    path = store()
    slide = open_slide(path)
    label = np.zeros((2967, 2220), np.uint8)
    label[:1024, :2048] = 1
    write_label(slide, "test", label, (1.0, 1.0), [("none", (0, 0, 0, 0))], {"n": 1}, "nearest")
    shard = path / "labels" / "test" / "0" / "c" / "0" / "0" / "0"
    swap_entries(shard, 9, 0, 3)  # (0, 0) written, (1, 0) absent: as a half write leaves it
    with pytest.raises(ChunkError, match=r"chunk \(0, 0\): chunk is missing"):  # listed: refused
        read_label(open_slide(path), "test", lambda a, _: a)
    labels = zarr.open_group(path / "labels", mode="r+")
    labels.attrs["ome"] = {**labels.attrs["ome"], "labels": []}  # never listed: the kill
    assert read_label(open_slide(path), "test", lambda a, _: a) is None
    write_label(open_slide(path), "test", label, (1.0, 1.0), [("none", (0, 0, 0, 0))],
                {"n": 2}, "nearest")  # fmt: skip
    assert np.array_equal(read_label(open_slide(path), "test", lambda a, _: a), label)


def test_a_store_made_before_positions_reads_verifies_and_gets_them_from_reshard(store):
    """Without positions (and the attribute saying so) a store reads and verifies as before
    and says its levels are not tied; `reshard` records them, as its chunks are then."""
    path = store()
    untie(path)
    pixels = open_slide(path).read_region(0, 0, 2220, 2967, level=0)
    result = verify_store(path, decode=True)
    assert result.ok and result.untied == ["0", "1", "2"]
    report = reshard(path)
    assert report.positions == 3 and report.arrays == 0  # in shards already: recorded in place
    assert verify_store(path).untied == []
    assert np.array_equal(open_slide(path).read_region(0, 0, 2220, 2967, level=0), pixels)
    swap_entries(path / "0" / "c" / "0" / "0" / "0", 130, 0, 1)
    assert len(verify_store(path).bad) == 2


def test_reshard_of_a_store_of_one_file_per_chunk_made_before_positions_records_them(store):
    path = store(shard="off")
    untie(path)
    report = reshard(path)
    assert report.arrays == 3 and report.positions == 3
    assert verify_store(path, decode=True).ok
    swap_entries(path / "1" / "c" / "0" / "0" / "0", 35, 0, 1)
    assert len(verify_store(path).bad) == 2


@pytest.mark.parametrize("damage", ["missing", "garbage", "shape"])
def test_positions_missing_or_damaged_where_declared_are_one_line(store, damage):
    path = store()
    recorded = path / positions.path_of("1")
    if damage == "missing":
        shutil.rmtree(recorded)
        cause = r"its chunk positions \(crc32c/1\) are missing, though the store says it"
    elif damage == "garbage":
        (recorded / "c" / "0" / "0" / "0").write_bytes(b"not zstd at all")
        cause = r"its chunk positions \(crc32c/1\) are damaged \(ValueError: "
    else:
        zarr.create_array(path, name="crc32c/1", shape=(2,), dtype="u8", overwrite=True)
        cause = r"its chunk positions \(crc32c/1\) are damaged \(ValueError: uint64 \(2,\)"
    with pytest.raises(ChunkError, match=rf"level 1: {cause}.*; convert the slide again"):
        open_slide(path).read_region(0, 0, 100, 100, level=1)
    result = verify_store(path)
    assert len(result.bad) == 1 and "level 1: its chunk positions (crc32c/1) are" in result.bad[0]
    assert result.chunks > 170  # the other chunks, level 1's too, still checked


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.permutations(range(130)))
def test_any_permutation_of_a_shard_index_is_caught_where_it_changes_pixels(stores, order):
    """Level 0 of CMU is one shard of 130 chunks: any reordering of its index (sealed again)
    is named by verify at exactly the positions that now read another chunk's bytes (two
    chunks of equal bytes, white glass, may trade places unseen: their pixels are equal)."""
    path = Path(stores(CMU))
    shard = path / "0" / "c" / "0" / "0" / "0"
    original = shard.read_bytes()
    level = zarr.open_group(path, mode="r")["0"]
    table = positions.Positions(level, "").table()[0]
    crcs = table.reshape(-1)
    try:
        permute_entries(shard, 130, order)
        bad = verify_store(path).bad
    finally:
        shard.write_bytes(original)
    moved = [i for i in range(130) if crcs[order[i]] != crcs[i]]
    assert [line.split(": ")[1] for line in bad] == [
        f"level 0 chunk (0, {i // 10}, {i % 10})" for i in moved
    ]
    assert (order == list(range(130))) <= (not bad)
    assert UNWRITTEN not in crcs  # every chunk of an image level is written


def test_info_and_verify_say_whether_chunks_are_tied(store):
    """The command line: `info` says whether a store's chunks are tied to their positions,
    `verify` names the levels of a store made before them, and a chunk out of place is an
    error line and exit code 2."""
    tied = store()
    old = tied.parent / "old" / tied.name
    shutil.copytree(tied, old)
    untie(old)

    def tilestore(*args):
        command = [sys.executable, "-m", "tilestore.cli", *map(str, args)]
        wide = {**os.environ, "COLUMNS": "500"}  # no line wrapped
        return subprocess.run(command, capture_output=True, text=True, timeout=300, env=wide)

    assert "each with its CRC32C, tied to its position" in tilestore("info", tied).stdout
    assert "not tied to its position (made before" in tilestore("info", old).stdout
    run = tilestore("verify", old)
    assert run.returncode == 0 and "not tied to their positions" in run.stdout
    assert "levels 0, 1, 2" in run.stdout
    swap_entries(tied / "2" / "c" / "0" / "0" / "0", 12, 4, 5)
    run = tilestore("verify", tied)
    assert run.returncode == 2
    assert run.stderr.count(f"tilestore: error: {tied}: level 2 chunk") == 2
