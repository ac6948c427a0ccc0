"""Hand-offs between the run's threads: bounded queues that give up when the run stops.

Standard library only: the decoder worker processes (`tilestore.embed.procdecode`) import it too.
"""

from __future__ import annotations

import contextlib
import queue
import threading

DONE = object()  # put after a stream's last item


class Stopped(Exception):
    """The run is stopping: a thread waiting for room or for a buffer gives up."""


def put(target: queue.Queue, item: object, stop: threading.Event) -> None:
    """Put, unless the run stops while the queue is full (then raise Stopped)."""
    while True:
        try:
            target.put(item, timeout=0.2)
            return
        except queue.Full:
            if stop.is_set():
                raise Stopped from None


def drain(target: queue.Queue) -> None:
    """Empty a queue without waiting, so a thread blocked putting into it can go on."""
    with contextlib.suppress(queue.Empty):
        while True:
            target.get_nowait()
