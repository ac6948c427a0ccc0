"""Decoding rows of chunks in worker processes into shared memory."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import threading
from multiprocessing.shared_memory import SharedMemory

import google_crc32c
import imagecodecs
import numpy as np
import pytest
import torch
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import CMU
from tests.corpus import rewrite_chunk
from tilestore.embed.procdecode import ProcessDecoder, decode_chunks
from tilestore.errors import ChunkError
from tilestore.format import jpeg
from tilestore.format.integrity import Located
from tilestore.reading.opening import open_slide


@pytest.fixture
def decoder():
    pool = ProcessDecoder(2)
    yield pool
    pool.close()


def _wait(parts) -> list[int]:
    """Wait for a submitted row's parts; return the chunks they left to the caller."""
    return [i for part in parts for i in part.result(timeout=60)]


@pytest.mark.parametrize("parts", [1, 3])
def test_workers_decode_rows_like_libjpeg(stores, decoder, parts):
    reader = open_slide(stores(CMU)).chunks(0)
    coords = [(2, c) for c in range(10)] + [(99, 99)]  # the last chunk does not exist
    shape = (reader.chunk_h, reader.chunk_w, reader.channels)
    decoder.reserve(3, len(coords) * int(np.prod(shape)))
    block, done = decoder.submit(
        Located.of(reader.locations(coords)),
        coords,
        shape,
        reader.background,
        threading.Event(),
        parts,
    )
    assert len(done) == parts  # each part a request of its own, into its rows of the block
    assert _wait(done) == []  # every chunk decoded, the absent one as the background
    got = decoder.view(block, len(coords), shape)
    want = np.stack([reader.decode(reader.fetch_one(c)) for c in coords[:-1]])
    np.testing.assert_array_equal(got[:-1], want)
    assert (got[-1] == reader.background).all()
    decoder.release(block)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    height=st.integers(8, 40),
    width=st.integers(8, 40),
    rows=st.integers(1, 40),
    data=st.data(),
)
def test_a_part_writes_its_rows_of_the_block_and_nothing_else(tmp_path, height, width, rows, data):
    """Parts map only their rows, from a page boundary below them: any row size, any
    offset, the rows before and after stay as they were."""
    offset = data.draw(st.integers(0, rows - 1))
    count = data.draw(st.integers(1, rows - offset))
    shape = (height, width, 3)
    rng = np.random.default_rng(height * 1000 + width)
    images = rng.integers(0, 255, (count, *shape), dtype=np.uint8)
    # chunks of even index one after another in one file (a shard's ranges), odd ones files
    locations, packed = [], tmp_path / f"{height}-{width}.shard"
    with packed.open("wb") as shard:
        for i, image in enumerate(images):
            encoded = imagecodecs.jpeg8_encode(image, level=95)
            if i % 2:
                path = tmp_path / f"{height}-{width}-{i}.jpg"
                path.write_bytes(encoded)
                locations.append([str(path), 0, None])
            else:
                locations.append([str(packed), shard.tell(), len(encoded)])
                shard.write(encoded)
    locations[-1] = None  # a chunk never written: the background
    coords = [[0, i] for i in range(count)]
    size = rows * int(np.prod(shape))
    block = SharedMemory(create=True, size=size)
    try:
        view = np.ndarray((rows, *shape), np.uint8, buffer=block.buf)
        view[:] = 7
        assert decode_chunks(locations, coords, block.name, shape, 255, offset) == (count, [])
        for i in range(count - 1):
            want = imagecodecs.jpeg8_decode(imagecodecs.jpeg8_encode(images[i], level=95))
            np.testing.assert_array_equal(view[offset + i], want)
        assert (view[offset + count - 1] == 255).all()
        assert (view[:offset] == 7).all() and (view[offset + count :] == 7).all()
        del view
    finally:
        block.close()
        block.unlink()


def test_worker_errors_come_back_as_messages(decoder, tmp_path):
    bad = tmp_path / "not-a-jpeg"
    bad.write_bytes(b"hello")
    decoder.reserve(1, 64 * 64 * 3)
    _, done = decoder.submit(
        Located.of([[str(bad), 0, None]]), [(4, 2)], (64, 64, 3), 0, threading.Event()
    )
    with pytest.raises(ChunkError, match=r"chunk \(4, 2\): cannot decode: Not a JPEG"):
        _wait(done)


def test_workers_say_when_they_are_ready_and_a_dead_one_is_an_error(monkeypatch):
    decoder = ProcessDecoder(2)
    decoder.wait_ready()
    decoder.wait_ready()  # once only: the ready lines are not read twice
    assert all(worker.poll() is None for worker in decoder.workers)
    decoder.close()
    monkeypatch.setattr("sys.executable", "/bin/false")  # a worker that exits at once
    broken = ProcessDecoder(1)
    with pytest.raises(RuntimeError, match="decoder process did not start"):
        broken.wait_ready()
    broken.close()


def test_blocks_big_enough_are_kept_when_at_least_the_least_asked_for():
    decoder = ProcessDecoder(1)
    try:
        decoder.reserve(6, 1000)
        six = [block.name for block in decoder.blocks]
        decoder.reserve(16, 100, least=4)  # narrower rows: the six bigger blocks do
        assert [block.name for block in decoder.blocks] == six
        decoder.reserve(3, 5000, least=2)  # wider rows: new, bigger blocks
        assert len(decoder.blocks) == 3 and decoder.blocks[0].size >= 5000
        decoder.reserve(16, 100)  # no least: as many blocks as asked for
        assert len(decoder.blocks) == 16
    finally:
        decoder.close()


def test_blocks_are_unlinked_on_close(tmp_path):
    decoder = ProcessDecoder(1)
    decoder.reserve(2, 1024)
    names = [block.name for block in decoder.blocks]
    decoder.close()
    assert not any(os.path.exists(f"/dev/shm/{n.lstrip('/')}") for n in names)
    assert all(worker.poll() is not None for worker in decoder.workers)


class _Copy:
    """Stands in for a CUDA event: done once synchronised (or when made done)."""

    def __init__(self, done: bool = False) -> None:
        self.done, self.waited = done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = self.done = True


def test_a_block_in_copy_is_reused_only_after_its_copy(stores, decoder):
    reader = open_slide(stores(CMU)).chunks(0)
    coords = [(1, c) for c in range(4)]
    shape = (reader.chunk_h, reader.chunk_w, reader.channels)
    decoder.reserve(2, len(coords) * int(np.prod(shape)))
    stop = threading.Event()
    first, done = decoder.submit(
        Located.of(reader.locations(coords)), coords, shape, reader.background, stop
    )
    _wait(done)
    second, done = decoder.submit(
        Located.of(reader.locations(coords)), coords, shape, reader.background, stop
    )
    _wait(done)
    pending, finished = _Copy(), _Copy(done=True)
    decoder.release(first, pending)
    decoder.release(second, finished)
    third, done = decoder.submit(
        Located.of(reader.locations(coords)), coords, shape, reader.background, stop
    )
    assert third == second and not pending.waited  # the finished copy's block, no waiting
    _wait(done)
    fourth, done = decoder.submit(
        Located.of(reader.locations(coords)), coords, shape, reader.background, stop
    )
    assert fourth == first and pending.waited  # no block free: waited for the oldest copy
    _wait(done)
    want = np.stack([reader.decode(reader.fetch_one(c)) for c in coords])
    np.testing.assert_array_equal(decoder.view(fourth, len(coords), shape), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_blocks_copy_to_the_gpu_asynchronously(stores):
    reader = open_slide(stores(CMU)).chunks(0)
    shape = (reader.chunk_h, reader.chunk_w, reader.channels)
    rows = [[(r, c) for c in range(reader.grid[1])] for r in range(reader.grid[0])]
    decoder = ProcessDecoder(2)
    try:
        decoder.reserve(2, max(map(len, rows)) * int(np.prod(shape)), pin=True)
        stop, got = threading.Event(), []  # rows start before pinning ends: copies stay right
        for coords in rows * 3:  # more rows than blocks: every block is reused
            block, done = decoder.submit(
                Located.of(reader.locations(coords)), coords, shape, reader.background, stop
            )
            decoder.start_pinning()  # after the first row, as the engine does after a batch
            _wait(done)
            view = torch.from_numpy(decoder.view(block, len(coords), shape))
            got.append(view.to("cuda", non_blocking=True))
            copied = torch.cuda.Event()
            copied.record()
            decoder.release(block, copied)
        torch.cuda.synchronize()
        decoder.wait_pinned()
        assert len(decoder.pinned) == 2 and decoder.pin_error is None
        for coords, tiles in zip(rows * 3, got, strict=True):
            want = np.stack([reader.decode(reader.fetch_one(c)) for c in coords])
            np.testing.assert_array_equal(tiles.cpu().numpy(), want)
    finally:
        decoder.close()
    assert decoder.pinned == []


def test_our_readers_decode_as_the_level_declares_not_as_the_markers_guess(
    tmp_path, stores, cmu_pixels
):
    """A level that declares its chunks RGB-coded (imagecodecs_jpeg, colorspace_jpeg "RGB")
    holding streams without the Adobe marker that says so (as another tool may write them):
    zarr's codec decodes them as declared, and so must tilestore's own chunk reader and its
    decoder processes, or every colour shifts (the YCbCr transform a marker-less stream
    gets) with no error."""
    store = tmp_path / "cmu.ome.zarr"
    shutil.copytree(stores(CMU), store)
    array = zarr.open_array(store / "0", mode="r")
    assert [
        c["name"]
        for c in json.loads((store / "0/zarr.json").read_text())["codecs"][0]["configuration"][
            "codecs"
        ]
    ][1] == "imagecodecs_jpeg"
    rows, cols = (-(-s // c) for s, c in zip(array.shape[1:], array.chunks[1:], strict=True))

    def unmarked(sealed: bytes) -> bytes:
        stream = sealed[:-4]
        assert jpeg.ADOBE_RGB in stream  # Aperio's RGB-coded tiles, marked when copied
        stream = stream.replace(jpeg.ADOBE_RGB, b"", 1)
        return stream + struct.pack("<I", google_crc32c.value(stream))

    for row in range(rows):
        for col in range(cols):
            rewrite_chunk(store, unmarked, "0", row, col)
    declared = np.moveaxis(zarr.open_array(store / "0", mode="r")[:], 0, -1)
    height, width = cmu_pixels.shape[:2]
    assert np.array_equal(declared[:height, :width], cmu_pixels)  # zarr: as declared
    slide = open_slide(store)
    assert np.array_equal(slide.read_region(0, 0, width, height, level=0), cmu_pixels)
    reader = slide.chunks(0)
    coords = [(r, c) for r in range(2) for c in range(cols)]
    shape = (reader.chunk_h, reader.chunk_w, 3)
    block = SharedMemory(create=True, size=len(coords) * math.prod(shape))
    try:
        located = [list(at) for at in reader.locations(coords)]
        decode_chunks(
            located,
            coords,
            block.name,
            shape,
            255,
            checksum=True,
            required=True,
            colorspace=reader.jpeg_colorspace,
        )
        rows_ = np.ndarray((len(coords), *shape), np.uint8, buffer=block.buf)
        want = np.stack([reader.decode(reader.fetch_one(c)) for c in coords])
        assert np.array_equal(rows_, want)
        del rows_
    finally:
        block.close()
        block.unlink()


@pytest.fixture
def holed_in_place(tmp_path):
    """CMU-1-Small-Region.svs read in place, its tile (2, 2) made absent (byte count 0), as
    a scanner leaves tiles it never scanned."""
    import tifffile

    from tests.conftest import SLIDES
    from tilestore.conversion import open_in_place

    path = tmp_path / "holed.svs"
    shutil.copy(SLIDES / CMU, path)
    with tifffile.TiffFile(path, mode="r+b") as tif:
        page = tif.pages[0]
        counts = list(page.databytecounts)
        counts[2 * page.chunked[1] + 2] = 0  # chunked: (tiles down, across, 1)
        page.tags["TileByteCounts"].overwrite(counts)
    return open_in_place(path, sidecars=tmp_path / "sidecars").chunks(0)


def test_a_slides_own_tiles_decode_in_the_processes_as_its_reader_makes_them(
    holed_in_place, decoder
):
    """Read in place, the decoder processes read each tile by its byte range of the slide
    file and splice it as the level's reader does: every chunk the same pixels, bit for bit;
    the absent tile left to the reader (its background chunk), which makes it as it makes it
    for every other path."""
    reader = holed_in_place
    assert reader.frame is not None and reader.frame.prefix  # Aperio: tables, Adobe marker
    cols = reader.grid[1]
    coords = [(r, c) for r in range(3) for c in range(cols)]
    shape = (reader.chunk_h, reader.chunk_w, reader.channels)
    decoder.reserve(3, len(coords) * int(np.prod(shape)))
    locations = reader.locations(coords)
    hole = coords.index((2, 2))
    assert locations[hole] is None and hole >= len(coords) // 2  # in the second request
    block, done = decoder.submit(
        Located.of(locations),
        coords,
        shape,
        reader.background,
        threading.Event(),
        2,
        frame=reader.frame,
    )
    assert _wait(done) == [hole]  # its row in the block, not in its request
    got = decoder.view(block, len(coords), shape)
    for i, coord in enumerate(coords):
        if coord != (2, 2):
            np.testing.assert_array_equal(got[i], reader.decode(reader.fetch_one(coord)))
    decoder.release(block)


def test_tiles_not_of_the_levels_frame_are_left_undecoded(holed_in_place):
    """A tile that is not of the level's frame (another size here), or whose stream does not
    start as a JPEG stream, is never decoded as it is: its index comes back, untouched in
    the block, for the reader to re-encode or to name."""
    import dataclasses

    reader = holed_in_place
    coords = [(0, 0), (0, 1), (0, 2)]
    shape = (reader.chunk_h, reader.chunk_w, reader.channels)
    # the ranges alone (path, offset, length): a tile's recorded CRC-32C would refuse the
    # moved range below before its frame is looked at (test_sidecar_content covers that)
    located = [list(at)[:3] for at in reader.locations(coords)]
    located[2][1] += 1  # a range that does not start at the tile's SOI
    block = SharedMemory(create=True, size=len(coords) * math.prod(shape))
    try:
        rows_ = np.ndarray((len(coords), *shape), np.uint8, buffer=block.buf)
        rows_[:] = 7
        framed = reader.frame.as_json()
        count, left = decode_chunks(
            located, coords, block.name, shape, 255, frame=framed,
            colorspace=reader.jpeg_colorspace,
        )  # fmt: skip
        assert (count, left) == (3, [2])
        assert np.array_equal(rows_[0], reader.decode(reader.fetch_one((0, 0))))
        assert (rows_[2] == 7).all()
        other = dataclasses.replace(reader.frame, shape=(reader.chunk_h // 2, reader.chunk_w))
        assert decode_chunks(
            located[:2], coords[:2], block.name, shape, 255, frame=other.as_json()
        ) == (2, [0, 1])
        del rows_
    finally:
        block.close()
        block.unlink()


def test_a_slide_opened_through_a_link_decodes_in_the_processes(tmp_path, decoder):
    """The tiles' ranges name the slide file itself, not the link it was opened by (the
    processes' reads refuse links, as they do a store's chunk files)."""
    from tests.conftest import SLIDES
    from tilestore.conversion import open_in_place

    link = tmp_path / "linked.svs"
    link.symlink_to(SLIDES / CMU)
    reader = open_in_place(link, sidecars=tmp_path / "sidecars").chunks(0)
    coords = [(1, c) for c in range(reader.grid[1])]
    shape = (reader.chunk_h, reader.chunk_w, reader.channels)
    decoder.reserve(3, len(coords) * int(np.prod(shape)))
    block, done = decoder.submit(
        Located.of(reader.locations(coords)), coords, shape, reader.background, threading.Event(),
        frame=reader.frame,
    )  # fmt: skip
    assert _wait(done) == []
    got = decoder.view(block, len(coords), shape)
    for i, coord in enumerate(coords):
        np.testing.assert_array_equal(got[i], reader.decode(reader.fetch_one(coord)))
    decoder.release(block)


def test_a_damaged_frame_header_is_left_to_the_reader_not_a_dead_process():
    """A tile whose frame header is cut short is not of the level's frame (a ValueError
    inside, as every damaged marker is), so it is left to the reader: no struct error
    escaping a decoder process, which would die naming nothing."""
    frame = jpeg.TileFrame(jpeg.SOI, (8, 8), ((1, 1),) * 3, "ycbcr")
    assert frame.spliced(jpeg.SOI + b"\xff\xc0\x00\x04\x08\x01") is None
    assert frame.spliced(jpeg.SOI + b"\xff\xc0\x00\x0b\x08\x00\x08\x00\x08\x03\x01") is None
    with pytest.raises(ValueError, match="corrupt JPEG"):
        jpeg.read_header(jpeg.SOI + b"\xff\xc0\x00\x30\x08")  # a length past the end


def test_tiles_past_the_end_of_a_truncated_slide_are_left_to_the_reader(holed_in_place, tmp_path):
    """A slide file cut short: tiles whose ranges run past its end are read by the level's
    reader (the processes give the whole request back), not a ChunkError for the good tiles
    read in one range with them."""
    reader = holed_in_place
    coords = [(0, 0), (0, 1), (0, 2)]
    located = [list(at) for at in reader.locations(coords)]
    located[2][2] += 10**9  # the last tile's range now runs past the end of the file
    shape = (reader.chunk_h, reader.chunk_w, reader.channels)
    block = SharedMemory(create=True, size=len(coords) * math.prod(shape))
    try:
        got = decode_chunks(
            located, coords, block.name, shape, 255, frame=reader.frame.as_json(),
            required=True, colorspace=reader.jpeg_colorspace,
        )  # fmt: skip
        assert got == (0, [0, 1, 2])
    finally:
        block.close()
        block.unlink()
