"""The worker processes' loop (`tilestore.workers`): a reply a request, libraries' prints kept
out of the replies, and a caller gone before a reply ends a worker quietly; `Calls`: functions
run in them, a worker that dies or is closed failing its calls and never leaving one waiting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tilestore import workers

CHATTY = (
    "import os, sys\n"
    "from tilestore import workers\n"
    "def answer(request):\n"
    "    print('a library talking')  # to stderr, not into the replies\n"
    "    os.write(1, b'raw bytes too\\n')\n"
    "    return 'x' * request['size']\n"
    "workers.serve(answer)\n"
)


def test_a_reply_a_request_and_prints_kept_out_of_the_replies():
    done = subprocess.run(
        [sys.executable, "-c", CHATTY], input='{"size": 3}\n{"size": 5}\n',
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0
    assert done.stdout == "xxx\nxxxxx\n"
    assert done.stderr.count("a library talking") == 2 and "raw bytes too" in done.stderr


def test_a_caller_gone_before_the_reply_ends_the_worker_quietly():
    """The caller's end of the replies closed (the caller killed): exit 1, nothing said."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHATTY], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    proc.stdout.close()  # gone: the reply meets a broken pipe
    _, said = proc.communicate('{"size": 1000000}\n', timeout=60)
    assert proc.returncode == 1
    assert "Error" not in said and "Traceback" not in said
    assert said.count("a library talking") == 1


def test_a_worker_in_its_own_session_is_not_in_the_callers_process_group():
    import os

    proc = workers.start("tilestore.workers", session=True)
    try:
        assert os.getpgid(proc.pid) != os.getpgid(0)
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


BUSY = (
    "import time\n"
    "from tilestore import workers\n"
    "workers.serve(lambda request: print('in hand', flush=True) or time.sleep(120) or 'done')\n"
)
# a caller that starts the busy worker, asks it, says its pid, then waits to be killed
CALLER = (
    "import os, subprocess, sys, time\n"
    "from tilestore import workers\n"
    f"worker = subprocess.Popen([sys.executable, '-c', {BUSY!r}], stdin=subprocess.PIPE,\n"
    "                          stdout=subprocess.PIPE, text=True,\n"
    "                          env={**os.environ, workers.CALLER: str(os.getpid())})\n"
    "worker.stdin.write('{}\\n'); worker.stdin.flush()\n"
    "print(worker.pid, flush=True)\n"
    "time.sleep(300)\n"
)


def test_a_worker_busy_on_a_request_ends_when_its_caller_is_killed():
    """Killed mid-request, the caller leaves a worker that would answer in 120 s: it ends
    within seconds instead (a conversion's slide process, its Dask worker killed)."""
    import os
    import signal
    import time

    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    worker = int(caller.stdout.readline())
    # the worker's prints go to its stderr, the caller's: said once its request is in hand
    assert caller.stderr.readline() == "in hand\n"
    os.kill(worker, 0)  # alive, busy
    caller.kill()
    caller.wait()
    caller.stdout.close()
    caller.stderr.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _running(worker):
        time.sleep(0.1)
    if _running(worker):
        os.kill(worker, signal.SIGKILL)
        raise AssertionError("the worker outlived its caller by 20 s")


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- Calls: functions run in `python -m tilestore.calling` workers ---------------------------


def test_calls_return_results_and_raise_what_the_function_raised():
    calls = workers.Calls(1)
    try:
        assert calls(divmod, 17, 5) == (3, 2)
        with pytest.raises(ValueError, match="invalid literal"):
            calls(int, "x")
        assert calls(os.getpid) != os.getpid()  # in a process of its own ...
        assert calls(os.getpid) == calls(os.getpid)  # ... the same one, reused
    finally:
        calls.close()


def test_calls_from_several_threads_run_at_once_on_at_most_count_workers():
    calls = workers.Calls(2)
    try:
        with ThreadPoolExecutor(4) as pool:
            pids = list(pool.map(lambda _: calls(_slept_pid, 0.5), range(4)))
        assert len(set(pids)) == 2  # two workers, each taking two calls
    finally:
        calls.close()


def test_a_worker_killed_fails_its_call_and_a_call_waiting_for_it_gets_a_new_one():
    """The call the dead worker ran fails (WorkerGone); a call that was waiting for a
    worker is not left waiting for the dead one: a new worker is started for it."""
    calls = workers.Calls(1)
    try:
        pid = calls(os.getpid)
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(calls, time.sleep, 30)
            time.sleep(0.5)  # the one worker is busy
            waiting = pool.submit(calls, os.getpid)
            time.sleep(0.3)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(workers.WorkerGone, match="died"):
                running.result(timeout=30)
            assert waiting.result(timeout=60) not in (pid, os.getpid())
    finally:
        calls.close()


def test_a_stop_signal_to_a_keep_on_stop_worker_is_its_callers_to_act_on():
    """Ctrl-C at a terminal and SLURM's SIGTERM reach every process of the job: a worker
    making a group finishes its call (the caller decides what stops), and ends once
    closed; a worker without keep_on_stop (a slide's conversion) is stopped with it."""
    calls = workers.Calls(1, keep_on_stop=True)
    try:
        pid = calls(os.getpid)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(calls, _slept_pid, 1.0)
            time.sleep(0.5)
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGINT)
            assert running.result(timeout=30) == pid
    finally:
        calls.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    calls = workers.Calls(1)
    try:
        pid = calls(os.getpid)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(calls, _slept_pid, 30.0)
            time.sleep(0.5)
            os.kill(pid, signal.SIGTERM)
            with pytest.raises(workers.WorkerGone, match="died"):
                running.result(timeout=30)
    finally:
        calls.close()


def test_closed_calls_fail_at_once_and_wake_the_calls_waiting_for_a_worker():
    calls = workers.Calls(1)
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(calls, time.sleep, 2)
        time.sleep(0.5)
        waiting = [pool.submit(calls, os.getpid) for _ in range(2)]
        time.sleep(0.2)
        calls.close()  # the call it runs is finished; those waiting fail
        assert running.result(timeout=30) is None
        for future in waiting:
            with pytest.raises(workers.WorkerGone):
                future.result(timeout=30)
    with pytest.raises(workers.WorkerGone, match="closed"):
        calls(os.getpid)


def _slept_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


# -- Channel: one worker, calls side by side ------------------------------------------------------


def test_a_channel_answers_its_calls_side_by_side_each_to_its_caller():
    """A slow call does not hold up a quick one sent after it (the store processes: a
    slide's rows are not queued behind another slide's opening); each caller gets its own
    reply, and what the worker raised."""
    channel = workers.Channel("tests.channelworker")
    try:
        pid = channel(("pid",))
        assert pid != os.getpid()
        with ThreadPoolExecutor(4) as pool:
            slow = pool.submit(channel, ("sleep", 2.0, "slow"))
            time.sleep(0.3)
            started = time.perf_counter()
            quick = [pool.submit(channel, ("sleep", 0.0, i)) for i in range(3)]
            assert [q.result(timeout=30) for q in quick] == [0, 1, 2]
            assert time.perf_counter() - started < 1.5 and not slow.done()
            assert slow.result(timeout=30) == "slow"
        with pytest.raises(ValueError, match="its own error"):
            channel(("raise", "its own error"))
        with pytest.raises(RuntimeError, match="KeyError: 'lost'"):  # answered, never waited on
            channel(("crash", "lost"))
        assert channel(("pid",)) == pid  # the same process throughout
    finally:
        channel.close()
    assert channel.process.poll() is not None


def test_a_channel_whose_worker_dies_fails_the_calls_in_hand_and_every_call_after():
    channel = workers.Channel("tests.channelworker")
    try:
        pid = channel(("pid",))
        with ThreadPoolExecutor(2) as pool:
            running = [pool.submit(channel, ("sleep", 30.0, i)) for i in range(2)]
            time.sleep(0.5)
            os.kill(pid, signal.SIGKILL)
            for call in running:
                with pytest.raises(workers.WorkerGone, match=r"died \(exit code -9\)"):
                    call.result(timeout=30)
        assert not channel.alive
        with pytest.raises(workers.WorkerGone, match="died"):
            channel(("pid",))
    finally:
        channel.close()
