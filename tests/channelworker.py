"""A worker for the `tilestore.workers.Channel` tests: `python -m tests.channelworker`
answers ("sleep", seconds, value), ("pid",), ("raise", message) and ("crash", key) side by
side."""

from __future__ import annotations

import os
import time

from tilestore import workers


def answer(request):
    step, *args = workers.call_of(request)
    try:
        if step == "sleep":
            time.sleep(args[0])
            reply = (args[1], None)
        elif step == "pid":
            reply = (os.getpid(), None)
        elif step == "crash":  # the answer itself fails, outside its own error handling
            raise KeyError(args[0])
        else:
            raise ValueError(args[0])
    except ValueError as exc:
        reply = (None, exc)
    return workers.packed_reply(reply)


if __name__ == "__main__":
    workers.serve(answer, threads=3)
