"""The worker process of `tilestore.workers.Calls`: `python -m tilestore.calling`, one
pickled call a JSON line in, its result (or exception) out. It imports only the modules of
the functions it is asked to call."""

from __future__ import annotations

from tilestore import workers

if __name__ == "__main__":
    workers.serve(workers.answer_call)
