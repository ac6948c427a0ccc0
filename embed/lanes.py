"""Each slide's store work in its own order, the slides' side by side.

A slide's writes must land in order (its group made, its batches, its finish), but two
slides' never wait for each other: the writer thread hands each slide's steps to its lane,
and the lanes run on a small pool of threads. A small slide's finish (its last shard, its
positions, its record) then costs the next slide nothing (issue 68).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor


class Lanes:
    """Run callables in order per key, the keys at once on `workers` threads.

    `submit` never blocks on the work; `limit` bounds the steps queued across all lanes
    (each may hold a batch's rows): past it, `submit` waits for one to finish. A step that
    raises is kept (`error`) and the lane goes on: the steps handle their own failures."""

    def __init__(self, workers: int, limit: int, name: str = "tilestore-store") -> None:
        self._pool = ThreadPoolExecutor(max(1, workers), name)
        self._lanes: dict[Hashable, collections.deque[Callable[[], None]]] = {}
        self._lock = threading.Condition()
        self._queued, self._limit = 0, max(1, limit)
        self.error: BaseException | None = None

    def submit(self, key: Hashable, step: Callable[[], None]) -> None:
        with self._lock:
            while self._queued >= self._limit:
                self._lock.wait()
            self._queued += 1
            lane = self._lanes.get(key)
            if lane is not None:  # its lane is running: the step waits its turn there
                lane.append(step)
                return
            self._lanes[key] = collections.deque([step])
        self._pool.submit(self._drain, key)

    def _drain(self, key: Hashable) -> None:
        while True:
            with self._lock:
                step = self._lanes[key][0]
            try:
                step()
            except BaseException as exc:
                self.error = self.error or exc
            with self._lock:
                lane = self._lanes[key]
                lane.popleft()
                self._queued -= 1
                self._lock.notify_all()
                if not lane:
                    del self._lanes[key]
                    return

    def join(self) -> None:
        """Wait until every step submitted has run."""
        with self._lock:
            while self._queued:
                self._lock.wait()

    def close(self) -> None:
        self.join()
        self._pool.shutdown()
