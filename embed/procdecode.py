"""Decoding JPEG chunks in worker processes, straight into shared memory.

Threads in one Python process share the GIL: with readers, the producer, the GPU loop and
the writer all needing it, thread decoders stall each other (measured on a 16-core H100
host: ~6k tiles/s at most). Worker processes decode a whole grid row of chunk files each
(chunk files, or byte ranges of shards) into a shared-memory block that the engine copies to
the GPU in one transfer.

The workers are plain `python -m tilestore.embed.procdecode` processes reading one JSON
request per line (`tilestore.workers`), importing only numpy and imagecodecs. They map
the block through /dev/shm rather than SharedMemory, whose resource tracker would unlink the
parent's blocks when a worker exits.
"""

from __future__ import annotations

import collections
import itertools
import json
import mmap
import os
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from tilestore import workers as workers_
from tilestore.embed import nvtx
from tilestore.embed.queues import Stopped
from tilestore.errors import ChunkError
from tilestore.format.integrity import Located, Location, read_chunks, unseal
from tilestore.format.jpeg import TileFrame, as_declared


def decode_chunks(
    locations: list,
    coords: list,
    shm: str,
    shape: tuple[int, ...],
    background: int,
    offset: int = 0,
    *,
    checksum: bool = False,
    required: bool = False,
    where: str = "",
    colorspace: str | None = None,
    frame: dict | None = None,
) -> tuple[int, list[int]]:
    """Decode chunk i (at `locations[i]`: [path, offset, length], length None for a whole
    file; None where absent) into row offset + i of the shared block /dev/shm/<shm>; return
    the count and the chunks left to the caller. `coords[i]` is the chunk's (row, col), for
    messages.

    With `frame` (`TileFrame.as_json`: a level read in place), each location is a tile's
    whole stream in the slide file, spliced into its chunk as the level's reader splices it;
    a tile that is absent, not a JPEG stream or not of the level's frame is left undecoded
    and its index (in this request) returned, for the caller to make through the level's
    reader (a background chunk, or a re-encoded tile), so every chunk is what the reader
    gives.

    Each chunk is read and checked as `tilestore.format.chunks.ChunkReader` does (`where`
    names the store and level, `checksum` and `required` say what it promises; `colorspace`
    how its chunks are coded, as the level declares it): a missing,
    damaged or undecodable chunk is a ChunkError naming it. Chunks lying one after another
    in a shard are read in one call (`read_chunks`).

    Only the rows written are mapped, populated as they are mapped (MAP_POPULATE): page by
    page, a fresh mapping's faults cost 30% on top of decoding a grid row of 240 px chunks
    (38 ms of decode, 12 ms of faults; 1.6 ms to populate the 29 MB at once)."""
    import imagecodecs

    if not locations:
        return 0, []
    spliced = TileFrame.from_json(frame).spliced if frame is not None else None
    left: list[int] = []
    names = [f"{where} chunk ({row}, {col})" for row, col in coords]
    located = [None if at is None else Location(*at) for at in locations]
    try:
        found = read_chunks(located, names, required=required)
    except ChunkError:
        if frame is None:
            raise
        # a slide's tile that cannot be read as its range says (past the end of a truncated
        # file): every chunk of the request is left to the level's reader, which reads each
        # as it does on every path, and names the damage where there is one
        return 0, list(range(len(locations)))
    size = int(np.prod(shape))
    start = offset * size // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    length = (offset + len(locations)) * size - start
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # Linux has it
    with (
        open(f"/dev/shm/{shm.lstrip('/')}", "r+b") as fh,
        mmap.mmap(fh.fileno(), length, flags=flags, offset=start) as buf,
    ):
        out = np.ndarray(
            (len(locations), *shape), np.uint8, buffer=buf, offset=offset * size - start
        )
        for i, (data, name) in enumerate(zip(found, names, strict=True)):
            if spliced is not None:
                data = spliced(data)
                if data is None:
                    left.append(i)
                    continue
            if data is None:
                if required:  # absent from its shard, where every chunk was written
                    raise ChunkError(f"{name}: chunk is missing")
                out[i] = background  # never written, where the store allows it
                continue
            if checksum:
                data = unseal(data, name)
            try:
                imagecodecs.jpeg8_decode(data, **as_declared(colorspace), out=out[i])
            except (imagecodecs.Jpeg8Error, ValueError) as exc:
                raise ChunkError(f"{name}: cannot decode: {exc}") from exc
        del out
    return len(locations), left


def _answer(request: dict, marks) -> str:
    """One row decoded: its count (then a tab and the indices of the chunks left to the
    caller, if any), or "!" and why not (a damaged chunk: "!chunk\t...")."""
    if marks is not None:
        marks.push("decode (process)")
    try:
        count, left = decode_chunks(
            Located(*request["located"]).unpacked(),
            request["coords"],
            request["shm"],
            tuple(request["shape"]),
            request["background"],
            request["offset"],
            checksum=request["checksum"],
            required=request["required"],
            where=request["where"],
            colorspace=request.get("colorspace"),
            frame=request.get("frame"),
        )
        return f"{count}\t{','.join(map(str, left))}" if left else str(count)
    except ChunkError as exc:  # the store's damage: the engine raises it as it is
        return f"!chunk\t{' '.join(str(exc).split())}"
    except (OSError, ValueError, RuntimeError) as exc:  # reported; the engine raises it
        return "!" + f"{type(exc).__name__}: {exc}".replace("\n", " ")
    finally:
        if marks is not None:
            marks.pop()


def _serve() -> None:
    """The worker: "ready" once the decoder is loaded, then one row decoded per request."""
    import imagecodecs

    imagecodecs.jpeg8_decode  # noqa: B018 - loads the codec's extension now, not at the first row
    marks = nvtx.load() if os.environ.get(nvtx.ENV) == "1" else None  # --profile nvtx
    if marks is not None:
        marks.name_thread(f"tilestore-decoder-{os.getpid()}")
    workers_.serve(lambda request: _answer(request, marks), ready=True)


class ProcessDecoder:
    """Worker processes and a ring of shared-memory blocks they decode rows into.

    With pin=True the blocks are page-locked for CUDA (cudaHostRegister), so a decoded row
    goes to the GPU by DMA, asynchronously; such a block is handed back with the CUDA event
    that marks its copy done and is reused only once that event has passed.
    """

    def __init__(self, workers: int, nvtx_marks: bool = False) -> None:
        env = {**os.environ, nvtx.ENV: "1"} if nvtx_marks else None  # --profile nvtx
        self.workers = [workers_.start("tilestore.embed.procdecode", env) for _ in range(workers)]
        self._idle: queue.Queue = queue.Queue()
        for worker in self.workers:
            self._idle.put(worker)
        self._unready = list(self.workers)
        self._starting = threading.Lock()
        self._dispatch = ThreadPoolExecutor(workers, "tilestore-dispatch")
        self.blocks: list[SharedMemory] = []
        self.pinned: list[int] = []  # addresses registered with CUDA
        self.pin_error: str | None = None
        self._pin = False  # whether the blocks are to be page-locked
        self._pinning: threading.Thread | None = None
        self._free: queue.Queue = queue.Queue()
        self._copying: collections.deque = collections.deque()  # (block, CUDA event)
        self.tiles_cut = 0  # tiles cut from the blocks since they were made (`ProcessRows`)

    def wait_ready(self) -> None:
        """Return once every worker has started (Python and imagecodecs imported: about a
        second for 14 at once on an H100 host, spent while the model loads)."""
        with self._starting:
            for worker in self._unready:
                if worker.stdout.readline().strip() != "ready":
                    raise RuntimeError("a JPEG decoder process did not start (its error is above)")
            self._unready = []

    def reserve(self, count: int, nbytes: int, pin: bool = False, least: int | None = None) -> None:
        """Have `count` blocks of at least `nbytes`. The blocks there are kept if big enough
        and at least `least` (default `count`) of them: a slide of narrower rows after a wide
        one then reads fewer rows ahead instead of making (and page-locking) new blocks."""
        enough = len(self.blocks) >= (count if least is None else least)
        if enough and self.blocks[0].size >= nbytes and self._pin == pin:
            return
        self._release_blocks()
        self.blocks = [SharedMemory(create=True, size=max(nbytes, 1)) for _ in range(count)]
        self._pin, self.tiles_cut = pin, 0
        for index in range(count):
            self._free.put(index)

    def room(self, nbytes: int) -> int:
        """How many blocks of at least `nbytes` are free now (copies done are reclaimed,
        none waited for): what a slide read before its turn may take without waiting."""
        if not self.blocks or self.blocks[0].size < nbytes:
            return 0
        self._reclaim(wait=False)
        return self._free.qsize()

    def start_pinning(self) -> None:
        """Page-lock the blocks (if reserved with pin=True) on a background thread.

        About half a second for half a gigabyte, and it slows the decodes and copies beside
        it (the first batch of a ViT-S run came after 0.35 s instead of 0.11 s): the engine
        starts it once a few batches are out (`tilestore.embed.rows.ProcessRows`). A row copied
        from a block not yet pinned goes by a pageable copy: synchronous, equally right. Blocks are
        used from the first and pinned from the last, so the rows in flight meet it late.
        """
        if self._pin and self._pinning is None:
            self._pinning = threading.Thread(
                target=self._pin_blocks, name="tilestore-pin", daemon=True
            )
            self._pinning.start()

    def wait_pinned(self) -> None:
        """Return once the blocks being page-locked in the background are."""
        if self._pinning is not None:
            self._pinning.join()

    def _pin_blocks(self) -> None:
        import torch

        cudart = torch.cuda.cudart()
        for shm in reversed(self.blocks):
            address = _address(shm)
            error = int(cudart.cudaHostRegister(address, shm.size, 0))
            if error:  # stays pageable: copies are synchronous, results the same
                self.pin_error = f"cudaHostRegister of a decode block failed (error {error})"
                return
            self.pinned.append(address)

    def submit(
        self,
        located: Located,
        coords: list,
        shape: tuple[int, ...],
        background: int,
        stop: threading.Event,
        parts: int = 1,
        *,
        checksum: bool = False,
        required: bool = False,
        where: str = "",
        colorspace: str | None = None,
        frame: TileFrame | None = None,
    ) -> tuple[int, list[Future]]:
        """Start decoding into a free block; return (block index, futures of the chunks
        each request left undecoded: their rows in the block, for the caller to make).

        located, coords: where each chunk is (`ChunkReader.locations`, packed) and its
        (row, col);
        checksum, required, where, colorspace, frame: how the chunks are checked and decoded
        (`decode_chunks`).

        parts > 1 splits the chunks among that many requests, which idle workers take in
        the order submitted: a row is then ready sooner, and no worker waits while another
        finishes a whole row (`tilestore.embed.rows.ProcessRows`).
        """
        self.wait_ready()
        count = len(located.at)  # a Located, before a block is taken
        while True:
            self._reclaim()
            try:
                block = self._free.get(timeout=0.2)
                break
            except queue.Empty:
                if stop.is_set():
                    raise Stopped from None
        bounds = np.linspace(0, count, max(1, min(parts, count)) + 1).astype(int).tolist()
        framed = None if frame is None else frame.as_json()
        requests = [
            json.dumps(
                {
                    "located": located.part(start, stop_),
                    "coords": [list(c) for c in coords[start:stop_]],
                    "shm": self.blocks[block].name,
                    "shape": list(shape),
                    "background": int(background),
                    "offset": start,
                    "checksum": checksum,
                    "required": required,
                    "where": where,
                    "colorspace": colorspace,
                    "frame": None if frame is None else framed,
                }
            )
            for start, stop_ in itertools.pairwise(bounds)
        ]
        return block, [
            self._dispatch.submit(self._ask, request, start)
            for request, start in zip(requests, bounds, strict=False)
        ]

    def _ask(self, request: str, offset: int) -> list[int]:
        worker = self._idle.get()
        try:
            worker.stdin.write(request + "\n")
            worker.stdin.flush()
            answer = worker.stdout.readline()
        finally:
            self._idle.put(worker)
        if not answer:
            raise RuntimeError("a decoding worker process died")
        if answer.startswith("!chunk\t"):
            raise ChunkError(answer.split("\t", 1)[1].strip())
        if answer.startswith("!"):
            raise RuntimeError(f"decoding worker: {answer[1:].strip()}")
        _, _, left = answer.strip().partition("\t")
        return [offset + int(i) for i in left.split(",")] if left else []

    def view(self, block: int, count: int, shape: tuple[int, ...]) -> np.ndarray:
        return np.ndarray((count, *shape), np.uint8, buffer=self.blocks[block].buf)

    def release(self, block: int, copied=None) -> None:
        """Hand a block back; `copied`, a CUDA event, marks the end of its copy to the GPU."""
        if copied is None:
            self._free.put(block)
        else:
            self._copying.append((block, copied))

    def _reclaim(self, wait: bool = True) -> None:
        """Free the blocks whose copies are done; if none is free (and `wait`), wait for
        the oldest."""
        waiting = collections.deque()
        for block, copied in self._copying:
            if copied.query():
                self._free.put(block)
            else:
                waiting.append((block, copied))
        if wait and waiting and self._free.empty():
            block, copied = waiting.popleft()
            copied.synchronize()
            self._free.put(block)
        self._copying = waiting

    def close(self) -> None:
        self._dispatch.shutdown(wait=True, cancel_futures=True)
        for worker in self.workers:
            worker.stdin.close()
        for worker in self.workers:
            worker.wait(timeout=10)
        self._release_blocks()

    def _release_blocks(self) -> None:
        if self._pinning is not None:
            self._pinning.join()
            self._pinning = None
        for _, copied in self._copying:
            copied.synchronize()
        self._copying.clear()
        if self.pinned:
            import torch

            for address in self.pinned:
                torch.cuda.cudart().cudaHostUnregister(address)
        self.pinned = []
        for shm in self.blocks:
            shm.close()
            shm.unlink()
        self.blocks = []
        self._free = queue.Queue()


def _address(shm: SharedMemory) -> int:
    view = np.frombuffer(shm.buf, np.uint8)
    try:
        return view.ctypes.data
    finally:
        del view  # no export of the buffer may outlive this, or shm.close() fails


if __name__ == "__main__":
    _serve()
