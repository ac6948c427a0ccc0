"""Reusable host buffers for batches of tiles: pinned on CUDA, reused once their copy is done."""

from __future__ import annotations

import queue
import threading

import torch

from tilestore.embed.queues import Stopped


class SlotPool:
    """Reusable (pinned) host buffers; a slot is reused only after its copy has finished."""

    def __init__(
        self,
        slots: int,
        shape: tuple[int, ...],
        pin: bool,
        dtype: torch.dtype = torch.uint8,
    ) -> None:
        self.buffers = [torch.empty(shape, dtype=dtype, pin_memory=pin) for _ in range(slots)]
        self._free: queue.Queue = queue.Queue()
        for i in range(slots):
            self._free.put((i, None))

    def acquire(self, stop: threading.Event | None = None) -> int:
        """Return a free slot; with `stop`, give up (Stopped) once it is set."""
        while True:
            try:
                slot, event = self._free.get(timeout=0.2)
                break
            except queue.Empty:
                if stop is not None and stop.is_set():
                    raise Stopped from None
        if event is not None:
            event.synchronize()
        return slot

    def try_acquire(self) -> int | None:
        """Return a free slot, or None if all are in use."""
        try:
            slot, event = self._free.get_nowait()
        except queue.Empty:
            return None
        if event is not None:
            event.synchronize()
        return slot

    def release(self, slot: int, event: torch.cuda.Event | None = None) -> None:
        """Hand a slot back; `event`, a CUDA event, marks the end of its copy."""
        self._free.put((slot, event))
