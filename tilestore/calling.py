"""The worker process of `tilestore.workers.Calls`: `python -m tilestore.calling`, one
pickled call a JSON line in, its result (or exception) out. It imports only the modules of
the functions it is asked to call."""

from __future__ import annotations

import os
import signal

from tilestore import workers

if __name__ == "__main__":
    if os.environ.pop(workers.KEEP_ON_STOP, None):  # `Calls(keep_on_stop=True)`
        # a stop is its caller's to make: Ctrl-C at a terminal and SLURM's SIGTERM reach
        # this worker too, and a group killed half made would fail its store where the
        # caller would have released it; it ends when its caller closes it or is gone
        for stop in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop, signal.SIG_IGN)
    workers.serve(workers.answer_call)
