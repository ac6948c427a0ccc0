"""Shards: our reading and writing of zarr's `sharding_indexed` layout agrees with zarr's, a
damaged shard is named, and a converted slide is a few files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import CMU
from tests.counting import CountingStore
from tilestore.errors import ChunkError
from tilestore.format.chunks import ChunkReader
from tilestore.format.integrity import read_chunks
from tilestore.format.shards import ShardIndex, pack, shard_shape, sharded, write_atomic
from tilestore.reading.opening import open_slide
from tilestore.reading.verify import verify_store

RAW = {"serializer": zarr.codecs.BytesCodec()}  # chunk bytes are the pixels: easy to compare


def _array(folder: Path, shape, chunks, shard, checksums=True) -> zarr.Array:
    group = zarr.open_group(folder, mode="w", zarr_format=3)
    return group.create_array(
        "a", shape=shape, dtype="u1", fill_value=0, **sharded(RAW, chunks, shard, checksums)
    )


def _grid(array: zarr.Array) -> list[tuple[int, ...]]:
    counts = [-(-s // c) for s, c in zip(array.shape, array.chunks, strict=True)]
    return [tuple(int(i) for i in c) for c in np.ndindex(*counts)]


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 40),
    chunk=st.integers(1, 9),
    per=st.integers(1, 5),
    checksums=st.booleans(),
)
def test_our_index_finds_each_chunk_zarr_wrote(tmp_path_factory, rows, cols, chunk, per, checksums):
    """Any array and shard geometry: every inner chunk zarr wrote is read by its byte range
    from our reading of the shard's index, and holds that chunk's pixels."""
    folder = tmp_path_factory.mktemp("z")
    shape, chunks = (2, rows, cols), (2, chunk, chunk)
    array = _array(folder, shape, chunks, shard_shape(chunks, shape, per), checksums)
    data = np.random.default_rng(rows * cols).integers(1, 255, shape, dtype=np.uint8)
    array[:] = data
    coords = _grid(array)
    index = ShardIndex(array, folder / "a", "test")
    found = read_chunks(index.locate(coords), [str(c) for c in coords], required=True)
    for coord, raw in zip(coords, found, strict=True):
        window = tuple(slice(i * c, (i + 1) * c) for i, c in zip(coord, chunks, strict=True))
        want = np.zeros(chunks, np.uint8)  # zarr writes edge chunks whole, padded
        part = data[window]
        want[tuple(slice(0, n) for n in part.shape)] = part
        assert np.frombuffer(raw, np.uint8).reshape(chunks).tolist() == want.tolist()


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 30),
    cols=st.integers(1, 30),
    per=st.integers(1, 4),
    seed=st.integers(0, 2**31),
)
def test_many_chunks_located_at_once_are_those_located_one_by_one(
    tmp_path_factory, rows, cols, per, seed
):
    """A small slide's rows asked at once go through array operations: any shards, any
    order, chunks absent from their shard, the CRC-32C each carries: the same locations."""
    import tilestore.format.shards as shards

    folder = tmp_path_factory.mktemp("z")
    shape, chunks = (1, rows * 3, cols * 3), (1, 3, 3)
    array = _array(folder, shape, chunks, shard_shape(chunks, shape, per))
    rng = np.random.default_rng(seed)
    data = rng.integers(1, 255, shape, dtype=np.uint8)
    data *= np.kron(rng.random((rows, cols)) > 0.3, np.ones((3, 3), np.uint8))  # empty: absent
    array[:] = data
    coords = _grid(array)
    coords = [coords[i] for i in rng.permutation(len(coords))[: rng.integers(1, len(coords) + 1)]]
    expect = rng.integers(0, 2**32, len(coords)).tolist()
    index = ShardIndex(array, folder / "a", "test")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shards, "LOCATE_AS_ARRAYS", 1)
        at_once, bare = index.locate(coords, expect), index.locate(coords)
        patch.setattr(shards, "LOCATE_AS_ARRAYS", 10**9)
        assert at_once == index.locate(coords, expect)
        assert bare == index.locate(coords)  # no CRC-32C to carry
    assert (None in at_once) == any(
        not data[0, r * 3 : r * 3 + 3, c * 3 : c * 3 + 3].any() for _, r, c in coords
    )


@settings(max_examples=25, deadline=None)
@given(
    present=st.lists(st.booleans(), min_size=1, max_size=16),
    checksums=st.booleans(),
)
def test_zarr_reads_the_shards_we_pack(tmp_path_factory, present, checksums):
    """A shard packed by us (chunks absent where asked) reads in zarr as the chunks put in,
    and the fill value where a chunk is absent."""
    folder = tmp_path_factory.mktemp("z")
    n = len(present)
    _array(folder, (1, 4, 4 * n), (1, 4, 4), (1, 4, 4 * n), checksums)
    chunks = [np.full((1, 4, 4), i + 1, np.uint8) if p else None for i, p in enumerate(present)]
    shard = pack([None if c is None else c.tobytes() for c in chunks], crc=checksums)
    write_atomic(folder / "a" / "c" / "0" / "0" / "0", shard)
    got = zarr.open_array(folder / "a", mode="r")[:]
    for i, chunk in enumerate(chunks):
        want = 0 if chunk is None else i + 1
        assert (got[:, :, 4 * i : 4 * i + 4] == want).all()


def test_a_converted_slide_is_a_few_files_read_alike_by_zarr_and_by_us(stores):
    store = stores(CMU)
    files = sum(len(names) for _, _, names in os.walk(store))
    assert files < 15, files  # was 181: one file per chunk
    slide = open_slide(store)
    for level in range(len(slide.levels)):
        array = zarr.open_array(store / str(level), mode="r")
        assert array.shards is not None
        reader = slide.chunks(level)
        ours = reader.read(0, array.shape[1], 0, array.shape[2])
        assert np.array_equal(np.moveaxis(array[:], 0, -1), ours)


def _shard_file(store: Path) -> Path:
    return store / "0" / "c" / "0" / "0" / "0"


def test_a_truncated_shard_is_named_by_every_reader(store):
    store = store()
    shard = _shard_file(store)
    shard.write_bytes(shard.read_bytes()[:-100])  # its index cut short
    reader = open_slide(store).chunks(0)
    with pytest.raises(ChunkError, match=r"level 0 shard \(0, 0, 0\): shard index is corrupt"):
        reader.fetch([(0, 0)])
    result = verify_store(store)
    (bad,) = result.bad  # the shard once, not each of its 130 chunks
    assert bad.endswith(
        "level 0 shard (0, 0, 0): shard index is corrupt (its CRC-32C does not match)"
    )


def test_a_chunk_damaged_inside_a_shard_is_named_alone(store):
    store = store()
    shard = _shard_file(store)
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF  # inside the first chunk's bytes
    shard.write_bytes(bytes(data))
    reader = open_slide(store).chunks(0)
    with pytest.raises(ChunkError, match=r"level 0 chunk \(0, 0\): chunk is corrupt"):
        reader.fetch([(0, 0)])
    assert reader.fetch([(0, 1)])[0]  # its neighbours in the shard read
    result = verify_store(store)
    assert result.bad == [
        f"{store}: level 0 chunk (0, 0, 0): chunk is corrupt (its CRC-32C does not match its bytes)"
    ]


def test_a_shard_index_pointing_past_its_data_is_named(store):
    store = store()
    shard = _shard_file(store)
    array = zarr.open_array(store / "0", mode="r")
    chunks = (array.shards[1] // array.chunks[1]) * (array.shards[2] // array.chunks[2])
    data = bytearray(shard.read_bytes())
    body = len(data) - chunks * 16 - 4
    table = np.frombuffer(bytes(data[body : body + chunks * 16]), "<u8").reshape(-1, 2).copy()
    table[0, 1] = 10**9  # the first chunk "runs" far past the file
    rewritten = bytes(data[:body]) + pack_table(table)
    shard.write_bytes(rewritten)
    with pytest.raises(ChunkError, match="points past its data"):
        ChunkReader(array, 255, str(store)).fetch([(0, 0)])


def pack_table(table: np.ndarray) -> bytes:
    import google_crc32c

    raw = table.astype("<u8").tobytes()
    return raw + google_crc32c.value(raw).to_bytes(4, "little")


def test_a_failed_write_leaves_neither_the_shard_nor_a_partial_file(tmp_path, monkeypatch):
    """Killed or failing between writing and renaming: nothing under the shard's name, and
    the temporary file gone."""
    target = tmp_path / "c" / "0" / "0"

    def failing(src, dst):
        assert Path(src).read_bytes() == b"x" * 100  # written whole before the rename
        raise OSError("rename refused")

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="rename refused"):
        write_atomic(target, b"x" * 100)
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_a_store_of_one_file_per_chunk_still_reads_and_verifies(stores):
    """Stores made before shards (or with shard="off") hold a file per chunk: read as before,
    the same pixels as the sharded store's."""
    old, new = stores(CMU, shard="off"), stores(CMU)
    assert zarr.open_array(old / "0", mode="r").shards is None
    assert sum(len(names) for _, _, names in os.walk(old)) > 170  # 130 + 35 + 12 chunks
    for level in range(3):
        a, b = open_slide(old), open_slide(new)
        np.testing.assert_array_equal(
            a.read_region(100, 200, 700, 500, level=level),
            b.read_region(100, 200, 700, 500, level=level),
        )
    assert verify_store(old, decode=True).ok


def test_an_index_pointing_one_chunk_at_anothers_bytes_is_refused(store):
    """An index rewritten (its CRC-32C made right) so chunk (0, 1) reads chunk (0, 0)'s bytes
    would give valid pixels in the wrong place: refused, from local files and through
    another store's byte ranges alike, and by verify."""
    store = store()
    shard = _shard_file(store)
    array = zarr.open_array(store / "0", mode="r")
    chunks = (array.shards[1] // array.chunks[1]) * (array.shards[2] // array.chunks[2])
    data = shard.read_bytes()
    body = len(data) - chunks * 16 - 4
    table = np.frombuffer(data[body : body + chunks * 16], "<u8").reshape(-1, 2).copy()
    table[1] = table[0]  # (0, 1) -> (0, 0)'s bytes
    shard.write_bytes(data[:body] + pack_table(table))
    for slide in (open_slide(store), open_slide(CountingStore.local(store))):
        with pytest.raises(ChunkError, match="shard index has chunks sharing bytes"):
            slide.chunks(0).fetch([(0, 1)])
    (bad,) = verify_store(store).bad
    assert bad.endswith(
        "level 0 shard (0, 0, 0): shard index has chunks sharing bytes (rewritten?)"
    )


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=0, max_size=2500),
    short=st.integers(1, 5000),
)
def test_a_shard_written_from_its_parts_is_their_bytes_even_when_writev_is_short(
    tmp_path_factory, sizes, short
):
    """`write_atomic` writes a shard's parts with writev, IOV buffers a call; a call that
    writes less than asked (the system may) is followed from where it stopped."""
    import os as os_module

    from tilestore.format import shards as shards_module

    parts = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    real = os_module.writev

    def at_most(fd, buffers):  # writes at most `short` bytes a call
        data = b"".join(bytes(b) for b in buffers)[:short]
        return real(fd, [data])

    path = tmp_path_factory.mktemp("writev") / "c" / "0"
    original = shards_module.os.writev
    shards_module.os.writev = at_most
    try:
        shards_module.write_atomic(path, parts)
    finally:
        shards_module.os.writev = original
    assert path.read_bytes() == b"".join(parts)
    assert [p.name for p in path.parent.iterdir()] == ["0"]  # nothing left beside it
