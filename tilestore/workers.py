"""Worker processes fed one JSON request a line, for the decoder processes
(`tilestore.embed.procdecode`), the slide worker (`tilestore.embed.inputs`) and the tissue mask
made beside a copy (`tilestore.conversion.beside`).

They are plain `python -m <module>` processes: unlike multiprocessing's spawn and
forkserver, they never import the caller's main module (a user script without a __main__
guard would run again in each), and they import only what their module does (never torch).
A worker answers through a private copy of its stdout, so anything a library prints goes
to stderr instead of into the replies, and ends when its caller is gone, even in the middle
of a request.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import itertools
import json
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any


def start(
    module: str, env: dict[str, str] | None = None, *, session: bool = False
) -> subprocess.Popen:
    """Start `python -m module` with line-buffered text pipes to its stdin and stdout;
    session: in a session of its own, where a Ctrl-C at the terminal does not reach it (the
    caller, which it does reach, stops it). The worker is told who its caller is (CALLER),
    to end with it."""
    return subprocess.Popen(
        [sys.executable, "-m", module],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
        env={**(os.environ if env is None else env), CALLER: str(os.getpid())},
        start_new_session=session,
    )


CALLER = "TILESTORE_WORKER_CALLER"  # the environment's pid of the process a worker serves


def serve(
    answer: Callable[[dict[str, Any]], str],
    requests: IO[str] | None = None,
    replies: IO[str] | None = None,
    *,
    ready: bool = False,
    threads: int = 0,
) -> None:
    """The worker's loop: one reply line (`answer`'s, flushed) per JSON request line, after
    "ready" where asked. threads: requests answered side by side on that many threads, each
    reply tagged with its request's "id" (a `Channel`'s), in the order they finish; at the
    end of the requests, those in hand are answered first. Without `replies`, they go to a
    private copy of stdout and stdout itself is pointed at stderr. A Ctrl-C that reached the
    caller's terminal too ends the worker quietly (the caller reports it), as does a caller
    gone before a reply."""
    caller = os.environ.pop(CALLER, None)  # not handed down to its own workers
    # "the time limit is near" (`tilestore.stopping`) is its caller's to act on: a job
    # step's signal reaches every process of it, and SIGUSR1 would end this one
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if caller is not None:  # a worker process that `start` made: it ends with its caller
        threading.Thread(target=_end_with, args=(int(caller),), daemon=True).start()
    if replies is None:
        replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        if ready:
            replies.write("ready\n")
            replies.flush()
        lines = requests if requests is not None else sys.stdin
        if threads:
            _serve_side_by_side(answer, lines, replies, threads)
            return
        for line in lines:
            replies.write(answer(json.loads(line)) + "\n")
            replies.flush()
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # the caller is gone (killed): no one to answer, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), replies.fileno())
        sys.exit(1)


def _serve_side_by_side(
    answer: Callable[[dict[str, Any]], str], lines, replies: IO[str], threads: int
) -> None:
    """Answer each request on one of `threads` threads, its reply tagged with its "id"."""
    from concurrent.futures import ThreadPoolExecutor

    lock = threading.Lock()

    def one(request: dict[str, Any]) -> None:
        try:
            reply = json.loads(answer(request))
        except BaseException as exc:  # never a caller left waiting: what failed, as its reply
            reply = json.loads(packed_reply((None, RuntimeError(f"{type(exc).__name__}: {exc}"))))
        line = json.dumps({"id": request["id"], **reply}) + "\n"
        with lock:
            try:
                replies.write(line)
                replies.flush()
            except BrokenPipeError:  # the caller is gone: no one to answer
                os._exit(1)

    with ThreadPoolExecutor(threads, "tilestore-serve") as pool:
        for line in lines:
            pool.submit(one, json.loads(line))


def _end_with(caller: int, every: float = 0.1) -> None:
    """End this worker once its caller is gone (killed: the worker is given to another
    parent; gone before the worker started: at once). A worker in the middle of a long
    request (a conversion) would otherwise finish it unseen, racing the same work started
    again by the caller's rerun; a store process would keep its slides' locks from the rerun
    (a tenth of a second: the rerun's model takes longer to load)."""
    while os.getppid() == caller:
        time.sleep(every)
    os._exit(1)


class Calls:
    """Functions called in `count` worker processes (`python -m tilestore.calling`): each
    call blocks its thread until a worker has run it and returns its result, or raises what
    it raised; calls from several threads run at once, one a worker. The function, its
    arguments and its result travel pickled (the function by its module and name). A
    worker that dies fails its call (`WorkerGone`) and is started again for the next; once
    closed, a call fails at once (no worker is started again).

    keep_on_stop: the workers ignore SIGINT and SIGTERM, which reach every process of a
    terminal's foreground job or of a SLURM job, and finish the call in hand: for calls
    short enough to wait for that leave a store half made otherwise (an embeddings group).
    Without it a stop ends them as it ends their caller (a slide's conversion)."""

    def __init__(self, count: int, *, keep_on_stop: bool = False) -> None:
        self._count, self._started, self._closed = max(1, count), 0, False
        self._env = {**os.environ, KEEP_ON_STOP: "1"} if keep_on_stop else None
        self._idle: queue.Queue[subprocess.Popen | None] = queue.Queue()
        self._all: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def __call__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        worker = self._take()
        call = (function.__module__, function.__qualname__, args, kwargs)
        try:
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(json.dumps({"call": _packed(call)}) + "\n")
            line = worker.stdout.readline()
        except (OSError, ValueError):  # a broken pipe; its pipes closed by `close`
            line = ""
        if not line:  # it died on this call: a new one takes the next
            code = worker.poll()
            with self._lock:
                if worker in self._all:  # (not after close)
                    self._all.remove(worker)
                    self._started -= 1
            self._idle.put(None)  # a call waiting for a worker starts one in its place
            worker.kill()
            raise WorkerGone(f"the worker process running {function.__qualname__} died "
                             f"(exit code {code})")  # fmt: skip
        self._idle.put(worker)
        result, error = _unpacked(json.loads(line)["reply"])
        if error is not None:
            raise error
        return result

    def _take(self) -> subprocess.Popen:
        """An idle worker, a new one while fewer than `count` run, or the next to be idle.
        None on the idle queue wakes a waiting call to look again: a worker died (its place
        is free) or the workers were closed (each waiting call is told, in turn)."""
        while True:
            with self._lock:
                if self._closed:
                    self._idle.put(None)
                    raise WorkerGone("the worker processes are closed")
                if self._idle.empty() and self._started < self._count:
                    self._started += 1
                    worker = start("tilestore.calling", self._env)
                    self._all.append(worker)
                    return worker
            worker = self._idle.get()
            if worker is not None and not self._closed:
                return worker
            # None, or a worker handed back after `close`: look again (closed: WorkerGone)

    def close(self) -> None:
        """Stop the workers (each also ends with its caller)."""
        with self._lock:
            workers, self._all, self._closed = self._all, [], True
        self._idle.put(None)  # wakes the calls waiting for a worker
        for worker in workers:
            with contextlib.suppress(OSError):
                assert worker.stdin is not None
                worker.stdin.close()
        deadline = time.monotonic() + CLOSE_WAIT_S  # one wait for them all, not one each
        for worker in workers:
            try:
                worker.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            if worker.stdout is not None:
                worker.stdout.close()


class Channel:
    """Calls into one worker process (`python -m module`, serving with threads: `serve`) from
    many threads at once: each call tagged, answered as it finishes (not in turn), each
    caller waiting for its own reply. The call and its result travel pickled. A worker
    that dies fails every call in hand, and every call after (`WorkerGone`); `alive` says
    so. keep_on_stop: as `Calls`'."""

    def __init__(self, module: str, *, keep_on_stop: bool = False) -> None:
        env = {**os.environ, KEEP_ON_STOP: "1"} if keep_on_stop else None
        self.process = start(module, env)
        self._waiting: dict[int, Any] = {}  # id -> the Future its caller waits on
        self._ids = itertools.count()
        self._lock = threading.Lock()  # the calls waiting and `_gone`
        self._sending = threading.Lock()  # a call's line written whole
        self._gone: str | None = None  # why calls fail now
        self.exit_code: int | None = None  # the worker's, once it has ended
        self._reader = threading.Thread(target=self._replies, name=f"{module}-replies", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._gone is None

    def __call__(self, payload: Any) -> Any:
        """Send `payload` (the worker's `answer` takes it as request["call"]), wait for its
        reply; return its result, or raise what the worker raised."""
        from concurrent.futures import Future

        waiting: Future = Future()
        line = json.dumps({"call": _packed(payload)})
        with self._lock:
            if self._gone is not None:
                raise WorkerGone(self._gone)
            tag = next(self._ids)
            self._waiting[tag] = waiting
        with self._sending:  # one line at a time; replies are handed out meanwhile
            try:
                assert self.process.stdin is not None
                self.process.stdin.write(f'{{"id": {tag}, {line[1:]}\n')
                self.process.stdin.flush()
            except (OSError, ValueError):  # a broken pipe: its reader says why
                pass
        result, error = _unpacked(waiting.result())
        if error is not None:
            raise error
        return result

    def _replies(self) -> None:
        """Hand each reply to its caller; at the worker's end (or a reply that does not read:
        it died writing it, and is killed), fail the calls in hand, whatever happened."""
        assert self.process.stdout is not None
        try:
            for line in self.process.stdout:
                message = json.loads(line)
                with self._lock:
                    waiting = self._waiting.pop(message["id"], None)
                if waiting is not None:
                    waiting.set_result(message["reply"])
        except (ValueError, KeyError, OSError):
            self.process.kill()
        finally:
            self._end()

    def _end(self) -> None:
        """The worker has ended: every call in hand and after fails (WorkerGone)."""
        code = self.exit_code = self.process.wait()
        with self._lock:
            self._gone = self._gone or f"the worker process died (exit code {code})"
            waiting, self._waiting = list(self._waiting.values()), {}
            for pipe in (self.process.stdin, self.process.stdout):
                with contextlib.suppress(OSError):
                    pipe.close()
        for call in waiting:
            call.set_exception(WorkerGone(self._gone))

    def close(self, wait_s: float = 5.0) -> None:
        """End the worker once the calls in hand are answered (killed after `wait_s`)."""
        self.closing()
        try:
            self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(wait_s)  # its pipes closed

    def closing(self) -> None:
        """Tell the worker to end once the calls in hand are answered; no new call is sent
        (`close` waits for it: several closed at once wait once)."""
        with self._lock:
            self._gone = self._gone or "the worker process is closed"
        with self._sending, contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()


KEEP_ON_STOP = "TILESTORE_WORKER_KEEP_ON_STOP"  # set: the worker ignores SIGINT and SIGTERM
CLOSE_WAIT_S = 5.0  # how long closed workers are given to finish the call in hand, together


class WorkerGone(RuntimeError):
    """A worker process died while it ran a call."""


def _packed(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


def _unpacked(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))


def answer_call(request: dict[str, Any]) -> str:
    """A worker's reply to one call (`Calls`): (result, None) or (None, the exception), as
    JSON holding their pickle (`packed_reply`)."""
    module, name, args, kwargs = call_of(request)
    function: Any = importlib.import_module(module)
    for part in name.split("."):
        function = getattr(function, part)
    try:
        reply = (function(*args, **kwargs), None)
    except Exception as exc:
        reply = (None, exc)
    return packed_reply(reply)


def call_of(request: dict[str, Any]) -> Any:
    """What a request line carries (pickled by `Calls` or `Channel`)."""
    return _unpacked(request["call"])


def packed_reply(reply: tuple[Any, BaseException | None]) -> str:
    """A reply line: (result, None) or (None, the exception) as JSON holding their pickle. An
    exception that does not pickle comes back as a RuntimeError with its class and message."""
    try:
        packed = _packed(reply)
    except Exception:
        error = reply[1]
        packed = _packed((None, RuntimeError(f"{type(error).__name__}: {error}")))
    return json.dumps({"reply": packed})
