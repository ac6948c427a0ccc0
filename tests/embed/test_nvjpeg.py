"""nvJPEG decoding: rows grouped per call, in order; the real decoder where CUDA exists."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.conftest import CMU
from tilestore.embed.nvjpeg import (
    GPU_DECODERS,
    RowDecoder,
    TorchvisionNvjpeg,
    _encoded,
    decode_gpu,
    gpu_decode_agrees,
    gpu_decodes,
    group_chunks,
    open_decoder,
)
from tilestore.reading.opening import open_slide


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class _Recording:
    """A stand-in decoder: each chunk 'decodes' to a tensor holding its number. With `hold`,
    its first call says it has begun (`entered`) and waits for `hold`: rows submitted
    meanwhile queue up behind it, as behind a slow call."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.calls: list[list[int]] = []
        self.hold, self.entered = hold, threading.Event()

    def __call__(self, data):
        self.calls.append(list(data))
        if self.hold is not None and len(self.calls) == 1:
            self.entered.set()
            assert self.hold.wait(timeout=60)
        return [torch.tensor([d]) for d in data]


class _Gate(Future):
    """A row's bytes not fetched yet; says when the decoder has begun waiting for them."""

    def __init__(self) -> None:
        super().__init__()
        self.waited = threading.Event()

    def result(self, timeout=None):
        self.waited.set()
        return super().result(timeout)


def test_rows_come_back_in_order_with_their_own_chunks_grouped_per_call():
    hold = threading.Event()
    fake = _Recording(hold)
    sizes = [10, 3, 1, 4, 2, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
    rows, start = [], 0
    with RowDecoder(fake, group=10, device=torch.device("cpu")) as decoder:
        for size in sizes:
            chunks = list(range(start, start + size))
            rows.append((chunks, decoder.submit(size, _done(chunks))))
            start += size
            if len(rows) == 1:  # a whole group: its call begins alone, the rest queue
                assert fake.entered.wait(timeout=60)
        hold.set()
        for chunks, future in rows:
            got, ready = future.result(timeout=10)
            assert [int(t) for t in got] == chunks and ready is None
    assert [d for call in fake.calls for d in call] == list(range(sum(sizes)))
    # rows queued behind a call are gathered, a call closed as soon as it holds a group
    # (exactly one too): 3+1+4+2, 5+9, 2+6+5, 3+5+8, 9+7
    assert [len(call) for call in fake.calls] == [10, 10, 14, 13, 16, 16]
    assert decoder.calls == [10, 10, 14, 13, 16, 16]


def test_a_failed_fetch_fails_its_rows_and_the_decoder_goes_on():
    fake = _Recording()
    with RowDecoder(fake, group=1, device=torch.device("cpu")) as decoder:
        broken: Future = Future()
        broken.set_exception(OSError("chunk unreadable"))
        bad = decoder.submit(2, broken)
        good = decoder.submit(1, _done([7]))
        with pytest.raises(OSError, match="chunk unreadable"):
            bad.result(timeout=10)
        assert [int(t) for t in good.result(timeout=10)[0]] == [7]


def test_closing_cancels_rows_not_decoded_yet():
    """The call under way (waiting on its row's bytes) finishes; the rows behind it are
    cancelled. The bytes arrive just as `close` asks the decoder to stop."""
    fake = _Recording()
    gate = _Gate()
    decoder = RowDecoder(fake, group=1, device=torch.device("cpu"))
    first = decoder.submit(1, gate)
    later = [decoder.submit(1, _done([i])) for i in range(5)]
    assert gate.waited.wait(timeout=60)  # the decoder waits on the first row's bytes
    put = decoder._todo.put

    def stop_then_bytes(item):  # close() has said "closing": now the bytes come
        put(item)
        if item is None:
            gate.set_result([0])

    decoder._todo.put = stop_then_bytes
    decoder.close()
    assert [int(t) for t in first.result(timeout=0)[0]] == [0]  # decoded, not cancelled
    assert all(row.cancelled() for row in later) and fake.calls == [[0]]


def test_group_size_follows_the_chunk_size():
    assert group_chunks(256, 256) == 256
    assert group_chunks(512, 512) == 64
    assert group_chunks(240, 240) == 291
    assert group_chunks(8192, 8192) == 1


@pytest.mark.parametrize(
    ("mode", "jpeg", "side", "channels", "want"),
    [
        ("cpu", True, 1024, 3, False),
        ("gpu", True, 256, 3, True),
        ("gpu", False, 512, 3, False),  # zstd levels: nothing for nvJPEG
        ("gpu", True, 512, 1, False),  # grey chunks: the batched decoder writes 3 planes
        ("gpu", True, 240, 3, True),  # Aperio's chunks: decoded as coded
        ("cpu", False, 1024, 3, False),
    ],
)
def test_which_slides_nvjpeg_decodes(mode, jpeg, side, channels, want):
    reader = SimpleNamespace(is_jpeg=jpeg, chunk_h=side, chunk_w=side, channels=channels)
    assert gpu_decodes(mode, reader) is want


def test_a_gpu_without_nvjpeg_fails_only_where_gpu_decoding_was_asked_for(monkeypatch):
    def no_nvjpeg(*args, **kwargs):
        raise RuntimeError("Not compiled with GPU support")  # as a ROCm build says

    monkeypatch.setattr("tilestore.embed.nvjpeglib.find_library", lambda: None)
    monkeypatch.setattr("torchvision.io.decode_jpeg", no_nvjpeg)
    assert open_decoder(torch.device("cuda", 0), required=False) is None  # --decode auto
    with pytest.raises(RuntimeError, match=r"no libnvjpeg found.*Not compiled with GPU support"):
        open_decoder(torch.device("cuda", 0))  # --decode gpu


def test_encoded_streams_are_views_of_one_buffer():
    data = [b"\xff\xd8abc", b"\xff\xd8de", b"\xff\xd8fghij"]
    tensors = _encoded(data)
    assert [bytes(t.numpy()) for t in tensors] == data
    assert all(t.is_contiguous() and t.dtype == torch.uint8 for t in tensors)
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("kind", GPU_DECODERS, ids=lambda kind: kind.__name__)
@pytest.mark.parametrize("copy", [False, True], ids=["ycbcr", "aperio-rgb"])
def test_grouped_nvjpeg_rows_match_libjpeg(stores, kind, copy):
    """Real decodes through the row decoder, several rows per call, read on another stream:
    our decoder reads Aperio's RGB-coded chunks as coded; torchvision's, as its hardware
    path does, colour-converts them (which the engine checks for, and decodes on the CPU)."""
    reader = open_slide(stores(CMU, copy=copy)).chunks(0)
    assert reader.color_space == ("rgb" if copy else "ycbcr")
    device = torch.device("cuda", torch.cuda.current_device())
    with contextlib.closing(kind(device)) as gpu:
        if copy and kind is TorchvisionNvjpeg:
            assert gpu_decode_agrees(gpu, reader, [(0, 0)], device) > 10.0
        else:
            _rows_match(gpu, reader, device)


def _rows_match(gpu, reader, device) -> None:
    consumer = torch.cuda.Stream(device)
    rows = [[(r, c) for c in range(reader.grid[1])] for r in range(reader.grid[0])]
    with (
        ThreadPoolExecutor(2) as fetch,
        RowDecoder(lambda data: decode_gpu(gpu, reader, data, device), 16, device) as decoder,
    ):
        futures = [decoder.submit(len(r), fetch.submit(reader.fetch, r)) for r in rows]
        for coords, future in zip(rows, futures, strict=True):
            chunks, ready = future.result(timeout=60)
            with torch.cuda.stream(consumer):
                consumer.wait_event(ready)
                got = torch.stack(chunks).permute(0, 2, 3, 1).cpu().numpy()
            want = np.stack([reader.decode(d) for d in reader.fetch(coords)])
            assert np.abs(got.astype(int) - want).mean() < 1.0
    assert len(decoder.calls) < len(rows)


@pytest.mark.gpu
@GPU
def test_the_first_decoder_that_starts_is_opened_and_a_wrong_size_chunk_is_refused(stores):
    device = torch.device("cuda", torch.cuda.current_device())
    with contextlib.closing(open_decoder(device)) as decoder:
        _refuses_wrong_size(decoder, stores)


def _refuses_wrong_size(decoder, stores) -> None:
    assert type(decoder) is GPU_DECODERS[0] and "nvJPEG" in decoder.name
    reader = open_slide(stores(CMU, copy=False)).chunks(0)
    (data,) = reader.fetch([(0, 0)])
    small = SimpleNamespace(
        chunk_h=reader.chunk_h // 2, chunk_w=reader.chunk_w, color_space="ycbcr"
    )
    with pytest.raises(ValueError, match=f"a chunk is {reader.chunk_h} x {reader.chunk_w} px"):
        decoder.decode(small, [data])


@pytest.mark.gpu
@GPU
def test_calls_back_to_back_of_changing_size_decode_right(stores):
    """The engine's decode thread calls again as soon as a call returns, with as many chunks
    as the rows waiting hold: no host wait in between, and every output right."""
    device = torch.device("cuda", torch.cuda.current_device())
    reader = open_slide(stores(CMU, copy=False)).chunks(0)
    coords = [(r, c) for r in range(reader.grid[0]) for c in range(reader.grid[1])]
    data = [d for d in reader.fetch(coords) if d is not None]
    outputs, at = [], 0
    with (
        contextlib.closing(open_decoder(device)) as decoder,
        torch.cuda.stream(torch.cuda.Stream(device)),
    ):
        for size in [1, 7, 30, 2, 64, 5] * 4:
            batch = [data[(at + i) % len(data)] for i in range(size)]
            outputs.append((batch, decoder.decode(reader, batch)))
            at += size
        torch.cuda.current_stream(device).synchronize()
    for batch, chunks in outputs:
        got = torch.stack(chunks).permute(0, 2, 3, 1).cpu().numpy()
        want = np.stack([reader.decode(d) for d in batch])
        assert np.abs(got.astype(int) - want).mean() < 1.0


def test_rows_queued_behind_a_failed_decode_are_not_decoded():
    """nvJPEG that failed once (an allocator failure) is not called again for the rows
    already queued: they fail with the same error, and the slide goes on on the CPU."""
    calls = []

    def decode(data):
        calls.append(list(data))
        raise RuntimeError("allocator failure")

    gate: Future = Future()
    with RowDecoder(decode, group=1, device=torch.device("cpu")) as decoder:
        first = decoder.submit(1, gate)
        queued = [decoder.submit(1, _done([i])) for i in range(3)]
        gate.set_result([9])
        for row in [first, *queued]:
            with pytest.raises(RuntimeError, match="allocator failure"):
                row.result(timeout=10)
    assert calls == [[9]]


@pytest.mark.gpu
@GPU
def test_decoders_release_what_they_hold_so_many_can_come_and_go(stores):
    """Each Embedder opens a decoder and closes it with itself: forty opened and closed in
    turn still decode right, and a closed one refuses to decode."""
    from tilestore.embed.nvjpeglib import NvjpegError

    device = torch.device("cuda", torch.cuda.current_device())
    reader = open_slide(stores(CMU, copy=False)).chunks(0)
    coords = [(r, c) for r in range(reader.grid[0]) for c in range(reader.grid[1])]
    data = [d for d in reader.fetch(coords) if d is not None][:16]
    want = np.stack([reader.decode(d) for d in data])
    for _ in range(40):
        decoder = open_decoder(device)
        got = torch.stack(decoder.decode(reader, data)).permute(0, 2, 3, 1).cpu().numpy()
        decoder.close()
    assert np.abs(got.astype(int) - want).mean() < 1.0
    if type(decoder) is not TorchvisionNvjpeg:
        with pytest.raises(NvjpegError, match="used after close"):
            decoder.decode(reader, data)
        decoder.close()  # a second close does nothing


@pytest.mark.gpu
@GPU
def test_nvjpeg_decodes_while_torch_keeps_most_of_the_gpu_cached(stores):
    """After a model's batches torch's caching allocator may keep most of the GPU, unused;
    nvJPEG allocates with cudaMalloc. Its allocator failure, seen late in an H100 test
    process, is met by giving torch's unused blocks back once and asking again."""
    device = torch.device("cuda", torch.cuda.current_device())
    reader = open_slide(stores(CMU, copy=False)).chunks(0)
    coords = [(r, c) for r in range(reader.grid[0]) for c in range(reader.grid[1])]
    data = [d for d in reader.fetch(coords) if d is not None][:48]
    with contextlib.closing(open_decoder(device)) as decoder:
        if type(decoder) is TorchvisionNvjpeg:
            pytest.skip("torchvision's decoder: no nvJPEG of ours in this process")
        # fill the GPU but 48 MiB through torch, then leave it cached (filling it to the last
        # byte can leave CUDA no room to answer even mem_get_info, as on one H100)
        free = torch.cuda.mem_get_info(device)[0]
        held = torch.empty(free - 3 * 2**24, dtype=torch.uint8, device=device)
        del held
        assert torch.cuda.mem_get_info(device)[0] < 2**27 < torch.cuda.memory_reserved(device)
        got = torch.stack(decoder.decode(reader, data)).permute(0, 2, 3, 1).cpu().numpy()
    want = np.stack([reader.decode(d) for d in data])
    assert np.abs(got.astype(int) - want).mean() < 1.0
