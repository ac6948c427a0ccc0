"""Decoding rows of chunks in worker processes into shared memory."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from embed.procdecode import ProcessDecoder
from tests.conftest import CMU
from tilestore.slide import open_slide


@pytest.fixture
def decoder():
    pool = ProcessDecoder(2)
    yield pool
    pool.close()


def test_workers_decode_rows_like_libjpeg(stores, decoder):
    reader = open_slide(stores(CMU)).chunks(0)
    coords = [(2, c) for c in range(10)] + [(99, 99)]  # the last chunk does not exist
    shape = (reader.chunk_h, reader.chunk_w, reader.channels)
    decoder.reserve(3, len(coords) * int(np.prod(shape)))
    block, done = decoder.submit(reader.paths(coords), shape, reader.background,
                                 threading.Event())
    assert done.result(timeout=60) == len(coords)
    got = decoder.view(block, len(coords), shape)
    want = np.stack([reader.decode(reader.fetch_one(c)) for c in coords[:-1]])
    np.testing.assert_array_equal(got[:-1], want)
    assert (got[-1] == reader.background).all()
    decoder.release(block)


def test_worker_errors_come_back_as_messages(decoder, tmp_path):
    bad = tmp_path / "not-a-jpeg"
    bad.write_bytes(b"hello")
    decoder.reserve(1, 64 * 64 * 3)
    _, done = decoder.submit([str(bad)], (64, 64, 3), 0, threading.Event())
    with pytest.raises(RuntimeError, match="decoding worker: Jpeg8Error: Not a JPEG file"):
        done.result(timeout=60)


def test_blocks_are_unlinked_on_close(tmp_path):
    decoder = ProcessDecoder(1)
    decoder.reserve(2, 1024)
    names = [block.name for block in decoder.blocks]
    decoder.close()
    assert not any(os.path.exists(f"/dev/shm/{n.lstrip('/')}") for n in names)
    assert all(worker.poll() is not None for worker in decoder.workers)
