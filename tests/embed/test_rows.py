"""Rows of decoded chunks read ahead, in the plan's chunk order."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tests.conftest import CMU
from tests.embed.conftest import settings
from tilestore.embed.nvjpeg import open_decoder
from tilestore.embed.procdecode import ProcessDecoder
from tilestore.embed.report import no_span
from tilestore.embed.rows import NvjpegRows, ProcessRows, ThreadRows, early_rows
from tilestore.format.integrity import Located
from tilestore.plan import PlanOptions, plan_over_tissue
from tilestore.plan.tiles import chunk_schedule, joined
from tilestore.reading.opening import open_slide

CUDA = torch.cuda.is_available()


def _steps(stores, **kwargs):
    slide = open_slide(stores(CMU, **kwargs))
    plan = plan_over_tissue(
        slide, PlanOptions(mpp=0.5, tile=224, min_tissue=0.0), store_tissue=False
    )
    return slide.chunks(plan.spec.level), chunk_schedule(plan)


def _check(source, reader, steps, channels_first=False):
    """Every step's new chunks come back once, in order, decoded as libjpeg does."""
    taken = []
    with source:
        for index, step in enumerate(steps):
            coords, chunks = source.take(index)
            assert coords == [tuple(rc) for rc in step.load.tolist()]
            for coord, chunk in zip(coords, chunks, strict=True):
                got = chunk.permute(1, 2, 0) if channels_first else chunk
                want = reader.decode(reader.fetch_one(coord))
                assert np.abs(got.cpu().numpy().astype(int) - want).mean() < 1.0
            taken += coords
    assert len(taken) == len(set(taken)) > 10


def test_thread_rows(stores):
    reader, steps = _steps(stores)
    with ThreadPoolExecutor(2) as decoders:
        _check(
            ThreadRows(steps, settings(readers=2), no_span, reader, decoders),
            reader,
            steps,
        )


def test_a_source_closed_early_gives_its_rows_up(stores):
    reader, steps = _steps(stores)
    with ThreadPoolExecutor(2) as decoders:
        source = ThreadRows(steps, settings(readers=2), no_span, reader, decoders)
        source.take(0)
        source.close()
        assert not source._pending


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_process_rows(stores):
    reader, steps = _steps(stores)
    device = torch.device("cuda", torch.cuda.current_device())
    procs = ProcessDecoder(2)
    try:
        source = ProcessRows(
            steps,
            settings(device, batch_size=64),
            no_span,
            reader,
            procs,
            threading.Event(),
        )
        _check(source, reader, steps)
    finally:
        procs.close()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_small_slide_read_early_comes_back_whole_and_only_where_blocks_are_free(stores):
    """A small slide's rows joined into one step and asked before its turn: nothing where
    the decoder processes have no blocks yet, or none free; its chunks, where they do."""
    reader, rows = _steps(stores)
    plan = plan_over_tissue(
        open_slide(stores(CMU)), PlanOptions(mpp=0.5, tile=224), store_tissue=False
    )
    steps = joined(chunk_schedule(plan), plan, 10**9)
    assert len(steps) == 1 < len(rows)
    device = torch.device("cuda", torch.cuda.current_device())
    run = settings(device, batch_size=64)
    procs = ProcessDecoder(2)
    try:
        assert early_rows(steps, run, no_span, reader, procs, threading.Event()) is None
        first = ProcessRows(steps, run, no_span, reader, procs, threading.Event())
        held = [
            procs.submit(Located.of([]), [], first.shape, 0, threading.Event())[0]
            for _ in procs.blocks
        ]
        assert early_rows(steps, run, no_span, reader, procs, threading.Event()) is None
        for block in held:
            procs.release(block)
        source = early_rows(steps, run, no_span, reader, procs, threading.Event())
        assert source is not None and source.asked_all
        _check(source, reader, steps)
        first.close()
    finally:
        procs.close()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_process_rows_of_a_slide_read_in_place_are_its_readers_pixels(tmp_path):
    """Read in place, the decoder processes take the slide's own tiles by byte range; a
    tile they leave (absent here) is made by the level's reader: every chunk on the GPU is
    bit for bit the reader's (what the thread path decodes)."""
    import shutil

    import tifffile

    from tests.conftest import SLIDES
    from tilestore.conversion import open_in_place

    path = tmp_path / "holed.svs"
    shutil.copy(SLIDES / CMU, path)
    with tifffile.TiffFile(path, mode="r+b") as tif:
        counts = list(tif.pages[0].databytecounts)
        counts[1 * tif.pages[0].chunked[1] + 2] = 0  # tile (1, 2) never scanned
        tif.pages[0].tags["TileByteCounts"].overwrite(counts)
    slide = open_in_place(path, sidecars=tmp_path / "sidecars")
    plan = plan_over_tissue(
        slide, PlanOptions(mpp=0.5, tile=224, min_tissue=0.0), store_tissue=False
    )
    reader, steps = slide.chunks(plan.spec.level), chunk_schedule(plan)
    assert reader.locations([(1, 2)]) == [None]
    device = torch.device("cuda", torch.cuda.current_device())
    procs = ProcessDecoder(2)
    try:
        source = ProcessRows(
            steps, settings(device, batch_size=64), no_span, reader, procs, threading.Event()
        )
        seen = []
        with source:
            for index in range(len(steps)):
                coords, chunks = source.take(index)
                for coord, chunk in zip(coords, chunks, strict=True):
                    want = reader.decode(reader.fetch_one(coord))
                    np.testing.assert_array_equal(chunk.cpu().numpy(), want)
                seen += coords
        assert (1, 2) in seen
    finally:
        procs.close()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_process_rows_hold_at_most_their_byte_budget_in_small_parts(stores, monkeypatch):
    reader, steps = _steps(stores)
    row = max(len(s.load) for s in steps) * reader.chunk_h * reader.chunk_w * reader.channels
    monkeypatch.setattr(
        "tilestore.embed.rows.AHEAD_BYTES", 3 * row - 1
    )  # room for two rows, not three
    monkeypatch.setattr("tilestore.embed.rows.PART_PIXELS", 3 * reader.chunk_h * reader.chunk_w)
    device = torch.device("cuda", torch.cuda.current_device())
    procs = ProcessDecoder(3)
    asked = []
    submit = procs.submit
    monkeypatch.setattr(procs, "submit", lambda *a, **k: asked.append(a[-1]) or submit(*a, **k))
    try:
        source = ProcessRows(
            steps,
            settings(device, batch_size=64),
            no_span,
            reader,
            procs,
            threading.Event(),
        )
        assert source.ahead == 2 and len(procs.blocks) == 4  # two rows ahead, two copying
        _check(source, reader, steps)
    finally:
        procs.close()
    loads = [len(s.load) for s in steps if len(s.load)]
    assert asked[-1] == -(-loads[-1] // 3)  # parts of at most three chunks


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_nvjpeg_rows(stores):
    reader, steps = _steps(stores, copy=False)  # YCbCr chunks
    device = torch.device("cuda", torch.cuda.current_device())
    decoder = open_decoder(device)
    _check(NvjpegRows(steps, settings(device), no_span, reader, decoder), reader, steps, True)
