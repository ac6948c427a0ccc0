"""The HPC recipes of docs/how-to/cohort-slurm.md under a real SLURM (Debian's slurm-wlm, one node,
started by `tests/slurm.py`): the `--shard K/N` job array and the dask-jobqueue `SLURMCluster`
script, each taken from that page as written with only the CPU adaptations (no GPU, a small
array, efficientnet-lite0), and the faults a cluster produces: a worker job cancelled mid-slide,
a preempted (requeued) array task, a node's disk full while writing.

Skipped, with the reason, where slurm-wlm is not installed or the tests do not run as root
(slurmd starts jobs as their user). `.ci/run` installs slurm-wlm.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import zarr

from tests.conftest import CMU, IHC, REPO, fill, group_of, run_cli
from tests.slurm import (
    CPU_FLAGS,
    LITE,
    Slurm,
    Unavailable,
    adapted,
    array_script,
    recipe_block,
    time_limit_script,
)

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        cluster = Slurm.start(tmp_path_factory.mktemp("slurm"))
    except Unavailable as why:
        pytest.skip(f"no SLURM here: {why}")
    # the jobs run this interpreter's tilestore (sbatch passes the environment on)
    cluster.env["PATH"] = f"{Path(sys.executable).parent}:{cluster.env['PATH']}"
    cluster.env["PYTHONPATH"] = str(REPO)
    cluster.env["OMP_NUM_THREADS"] = "1"  # as Dask's nanny sets it: the reference's float sums
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def cohort_root(tmp_path_factory, stores):
    """Four small real stores (two of CMU-1-Small-Region, two of the IHC image at 0.5 um/px)
    and their features from one `tilestore embed` process: what every run must equal."""
    root = tmp_path_factory.mktemp("cohort")
    _copy_stores(stores, root / "stores")
    reference = root / "reference"
    shutil.copytree(root / "stores", reference)
    _tilestore("embed", *sorted(reference.glob("*.ome.zarr")), "--model", LITE,
               *CPU_FLAGS.split(), env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    return root


def _copy_stores(stores, folder: Path, copies: str = "ab") -> list[Path]:
    folder.mkdir(parents=True)
    for name, kwargs in ((CMU, {}), (IHC, {"mpp": 0.5})):
        for copy in copies:
            shutil.copytree(stores(name, **kwargs), folder / f"{copy}-{name}.ome.zarr")
    return sorted(folder.glob("*.ome.zarr"))


def _tilestore(*argv, **kwargs) -> subprocess.CompletedProcess:
    done = run_cli(*argv, **kwargs)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _features(store: Path) -> tuple[np.ndarray, dict]:
    group = zarr.open_group(store / group_of(store, LITE), mode="r")
    return group["features"][:], dict(group.attrs["tilestore"])


def _assert_equal_to_reference(folder: Path, reference: Path) -> None:
    for store in sorted(folder.glob("*.ome.zarr")):
        got, attrs = _features(store)
        expected, _ = _features(reference / f"a-{store.name.split('-', 1)[1]}")
        assert attrs["complete"], f"{store.name} is not complete"
        np.testing.assert_array_equal(got, expected, err_msg=store.name)


def _done_batches(paths: list[Path]) -> int:
    total = 0
    for store in paths:
        try:
            total += int(zarr.open_array(store / group_of(store, LITE) / "done", mode="r")[:].sum())
        except (FileNotFoundError, KeyError, zarr.errors.BaseZarrError):
            continue
    return total


def _done_tiles(paths: list[Path], batch: int = 8) -> int:
    """The tiles of the batches marked done (a store's last batch may be short)."""
    total = 0
    for store in paths:
        try:
            group = zarr.open_group(store / group_of(store, LITE), mode="r")
        except (FileNotFoundError, KeyError, zarr.errors.BaseZarrError):
            continue
        tiles = group["features"].shape[0]
        total += sum(min(batch, tiles - b * batch) for b in np.flatnonzero(group["done"][:]))
    return total


def _log(slurm: Slurm, folder: Path) -> str:
    """Every job log in the folder and the daemons' tails, for a failure's message."""
    logs = [f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(folder.glob("*.out"))]
    logs += [f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(slurm.folder.glob("*.log"))]
    return "\n".join(logs)


# -- the recipes' array script -------------------------------------------------------------


def test_the_array_recipe_embeds_every_store_once(slurm, cohort_root, tmp_path):
    folder = tmp_path / "array"
    folder.mkdir()
    shutil.copytree(cohort_root / "stores", folder / "stores")
    script = folder / "embed.sbatch"
    script.write_text(array_script(2))
    job = slurm.sbatch(script, cwd=folder)
    slurm.wait(job, timeout=600)
    assert slurm.exit_codes(job) == {f"{job}_0": "COMPLETED 0:0", f"{job}_1": "COMPLETED 0:0"}, (
        _log(slurm, folder)
    )
    shares = [json.loads((folder / f"run-{k}.json").read_text()) for k in range(2)]
    embedded = [Path(s["store"]).name for share in shares for s in share["slides"]]
    every = sorted(p.name for p in (folder / "stores").glob("*.ome.zarr"))
    assert sorted(embedded) == every  # each store in exactly one task, none left out
    assert all(share["slides"] for share in shares)  # both tasks had work
    _assert_equal_to_reference(folder / "stores", cohort_root / "reference")


# -- the recipes' Dask script ----------------------------------------------------------------


def dask_script(jobs: int) -> str:
    venv = f"export PATH={Path(sys.executable).parent}:$PATH; export PYTHONPATH={REPO}"
    return adapted(
        recipe_block("SLURMCluster(", "python"),
        {
            'queue="gpu"': 'queue="debug"',
            "job_cpu=16": "job_cpu=1",
            'memory="64GB"': 'memory="3GB"',
            'job_extra_directives=["--gres=gpu:1"]': "job_extra_directives=[]",
            "source ~/venvs/tilestore/bin/activate": venv,
            "cluster.scale(jobs=8)": f"cluster.scale(jobs={jobs})",
            '"uni"': f'"{LITE}"',
            "Options(compile=True)": "Options(device='cpu', batch_size=8, precision='fp32', "
            "dtype='float32', shard_tiles=16), slice_tiles=16",
            # a look at what the recipe claims of its workers: not daemons
            "    report = embed_cohort(": "    print('daemonic workers:', sorted(set(client.run("
            "lambda: __import__('multiprocessing').current_process().daemon).values())))\n"
            "    report = embed_cohort(",
        },
    )


def _run_script(folder: Path, slurm: Slurm, **env: str):
    return subprocess.Popen(
        "python embed_cohort.py stores/*.ome.zarr", shell=True, cwd=folder,
        env={**slurm.env, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_the_dask_recipe_embeds_every_store_once(slurm, cohort_root, tmp_path):
    folder = tmp_path / "dask"
    folder.mkdir()
    shutil.copytree(cohort_root / "stores", folder / "stores")
    (folder / "embed_cohort.py").write_text(dask_script(2))
    run = _run_script(folder, slurm)
    stdout, stderr = run.communicate(timeout=600)
    print(stdout, stderr)
    assert run.returncode == 0, stderr[-3000:] + _log(slurm, folder)
    assert "daemonic workers: [False]" in stdout  # the prologue's setting reached them
    assert "efficientnet-lite0: 94 tiles on 2 worker(s)" in stdout
    assert "lost" not in stdout + stderr
    _assert_equal_to_reference(folder / "stores", cohort_root / "reference")
    assert not list(folder.rglob("*.dirlock"))  # Dask's scratch went to the node's TMPDIR
    workers = "".join(p.read_text() for p in folder.glob("slurm-*.out"))
    assert "Starting Worker plugin tilestore-embedder" in workers
    assert "Event loop was unresponsive" not in workers  # the model loads beside the loop


def test_a_cancelled_worker_job_is_named_replaced_and_its_work_redone(
    slurm, cohort_root, stores, tmp_path
):
    folder = tmp_path / "cancel"
    paths = _copy_stores(stores, folder / "stores", copies="abcdefgh")
    (folder / "embed_cohort.py").write_text(dask_script(2))
    earlier = slurm.job_ids("dask-worker")  # the other tests'
    # a replacement is asked once the lost worker's name has not come back (its job's nanny
    # restarting it) within the cluster's lost-worker timeout: 2 s here, not 15, so that it
    # is asked before the cohort ends
    run = _run_script(folder, slurm, DASK_DISTRIBUTED__DEPLOY__LOST_WORKER_TIMEOUT="2s")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (
        _done_batches(paths) < 4 or len(slurm.jobs("dask-worker", "RUNNING")) < 2
    ):
        assert run.poll() is None, run.communicate()[1][-3000:]
        time.sleep(0.2)
    victim = slurm.jobs("dask-worker", "RUNNING")[0]
    slurm.run("scancel", str(victim))
    stdout, stderr = run.communicate(timeout=600)
    print(stdout, stderr)  # shown where the test fails, and with -s
    assert run.returncode == 0, stderr[-3000:] + _log(slurm, folder)
    lost = [line for line in stdout.splitlines() if " lost after " in line]
    assert len(lost) == 1, stdout + _log(slurm, folder)
    assert "replacement: a new worker asked of the cluster" in lost[0]
    # SLURM got a new worker job (dask-jobqueue alone never submits one for a dead job)
    workers = slurm.job_ids("dask-worker") - earlier
    if " joined after " not in stdout:  # it came too late to work, or never: the report says
        assert "WARNING: the cohort ran short: 1 worker(s) lost, 1 of 2 left" in stdout
        # (on a busy CI box the cohort once ended before the cluster had submitted it)
        assert len(workers) in (2, 3), slurm.run("scontrol", "-o", "show", "job").stdout
    else:
        assert len(workers) == 3, slurm.run("scontrol", "-o", "show", "job").stdout
    assert " lost after " in stderr  # said when it happened, not only at the end
    _assert_equal_to_reference(folder / "stores", cohort_root / "reference")


# -- a preempted array task ---------------------------------------------------------------------


def test_a_requeued_array_task_stops_at_a_batch_and_resumes_with_nothing_lost(
    slurm, cohort_root, stores, tmp_path
):
    """SLURM preempts or requeues a task with SIGTERM, then SIGKILL after KillWait (30 s
    here); with --requeue the task runs again from its script."""
    folder = tmp_path / "requeue"
    paths = _copy_stores(stores, folder / "stores", copies="abcd")
    script = folder / "embed.sbatch"
    script.write_text(array_script(1, extra=" --requeue --open-mode=append"))
    job = slurm.sbatch(script, cwd=folder)
    task, log = f"{job}_0", folder / f"slurm-{job}_0.out"
    deadline = time.monotonic() + 300
    while _done_batches(paths) < 2:
        assert time.monotonic() < deadline and slurm.states(job), _log(slurm, folder)
        time.sleep(0.1)
    signalled = time.monotonic()
    slurm.run("scontrol", "requeue", task)
    while "interrupted (SIGTERM)" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() - signalled < 30, _log(slurm, folder)  # within KillWait
        time.sleep(0.1)
    kept = _done_tiles(paths)
    slurm.wait(job, timeout=600)
    assert slurm.exit_codes(job) == {task: "COMPLETED 0:0"}, _log(slurm, folder)
    restarts = slurm.run("scontrol", "-o", "show", "job", task).stdout
    assert "Restarts=1" in restarts
    text = log.read_text()
    assert text.count("interrupted (SIGTERM)") == 1
    assert re.search(r"\(\d+ done before\)", text), text  # the requeued run resumed
    resumed = json.loads((folder / "run-0.json").read_text())  # the second run's
    before = sum(s["skipped_done"] for s in resumed["slides"])
    before += sum(_features(Path(s["store"]))[0].shape[0] for s in resumed["skipped"])
    assert before == kept > 0  # every tile the first run finished was kept ...
    redone = sum(s["tiles"] for s in resumed["slides"])
    assert before + redone == sum(_features(p)[0].shape[0] for p in paths)  # ... none twice
    _assert_equal_to_reference(folder / "stores", cohort_root / "reference")


# -- a time limit, warned of ------------------------------------------------------------------


def test_a_task_warned_of_its_time_limit_keeps_its_shard_and_requeues_itself(
    slurm, cohort_root, stores, tmp_path
):
    """The how-to's time-limit script: SLURM sends SIGUSR1 to the batch shell 50 s before
    the limit (`--signal=B:USR1@50`), the shell passes it on, `tilestore embed` finishes the
    batch in flight, writes the shard it was filling (64 tiles: 8 batches, so a stop lands
    inside one), says what it kept and exits 138; the script requeues the task, which
    resumes. The limit is set once the task is embedding (as `--time` would have it for a
    task longer than its limit: SLURM's timers are checked every 30 s, so a warning asked
    for at a one-minute limit could come before the model is loaded). SLURM keeps a limit in
    whole minutes, so the warning comes up to 90 s after it is set: until it comes, the
    task runs a fifth of the time (stopped and continued), as on a slower machine, so it is
    still embedding then (a quick run of 20 stores had ended first)."""
    folder = tmp_path / "timelimit"
    paths = _copy_stores(stores, folder / "stores", copies="abcdefghij")
    script = folder / "embed.sbatch"
    flags = CPU_FLAGS.replace("--shard-tiles 16", "--shard-tiles 64")
    script.write_text(time_limit_script(1, "10", "B:USR1@50").replace(CPU_FLAGS, flags))
    job = slurm.sbatch(script, cwd=folder)
    task, log = f"{job}_0", folder / f"slurm-{job}_0.out"
    deadline = time.monotonic() + 300
    while _done_batches(paths) < 1:
        assert time.monotonic() < deadline and slurm.states(job), _log(slurm, folder)
        time.sleep(0.1)
    shown = slurm.run("scontrol", "-o", "show", "job", task).stdout
    ran = _seconds(re.search(r"RunTime=(\S+)", shown).group(1))
    # the first whole minute whose warning (50 s before it) is due: it comes at SLURM's
    # next check, while the task runs slowed
    slurm.run("scontrol", "update", f"JobId={task}", f"TimeLimit={-(-(ran + 51) // 60)}")
    said = "tilestore: the time limit is near (SIGUSR1)"
    embedding = _embedding(folder)
    while said not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, _log(slurm, folder)
        with _stopped(embedding):
            time.sleep(0.4)
        time.sleep(0.1)
    kept = _done_tiles(paths)
    # the next attempt may take its time (the limit stays with the job otherwise)
    slurm.run("scontrol", "update", f"JobId={task}", "TimeLimit=10")
    (line,) = [x for x in log.read_text().splitlines() if said in x]
    # every tile the run counted is written and marked done, the partly filled shard too
    assert f"stopped after the batch in flight; {kept} tiles embedded by this run" in line
    middle = re.search(r"(\d+) of (\d+) batches of embeddings/", line)
    assert middle and 0 < int(middle.group(1)) < int(middle.group(2)), line
    slurm.wait(job, timeout=300)
    assert slurm.exit_codes(job) == {task: "COMPLETED 0:0"}, _log(slurm, folder)
    assert "Restarts=1" in slurm.run("scontrol", "-o", "show", "job", task).stdout
    text = log.read_text()
    print(text)  # shown where the test fails, and with -s
    assert text.count(said) == 1 and "DUE TO TIME LIMIT" not in text, text
    resumed = json.loads((folder / "run-0.json").read_text())  # the second attempt's
    before = sum(s["skipped_done"] for s in resumed["slides"])
    before += sum(_features(folder / s["store"])[0].shape[0] for s in resumed["skipped"])
    assert before == kept > 0  # what the first attempt said it kept, it kept ...
    redone = sum(s["tiles"] for s in resumed["slides"])
    assert before + redone == sum(_features(p)[0].shape[0] for p in paths)  # ... none twice
    _assert_equal_to_reference(folder / "stores", cohort_root / "reference")


def _embedding(folder: Path) -> psutil.Process:
    """The batch script's `tilestore embed`, started in `folder`."""
    (found,) = [
        p
        for p in psutil.process_iter(["cmdline", "cwd"])
        if p.info["cwd"] == str(folder) and "embed" in (p.info["cmdline"] or [])
    ]
    return found


@contextlib.contextmanager
def _stopped(process: psutil.Process):
    """`process` stopped (SIGSTOP) for the block, then continued; a signal sent meanwhile
    is acted on once it continues."""
    with contextlib.suppress(psutil.NoSuchProcess):
        process.suspend()
    try:
        yield
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.resume()


def _seconds(runtime: str) -> int:
    """SLURM's [days-]hours:minutes:seconds as seconds."""
    days, _, clock = runtime.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


# -- a node's disk full -----------------------------------------------------------------------


def _files(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in store.rglob("*") if p.is_file()}


def test_a_full_disk_fails_the_task_in_one_line_and_the_rerun_finishes(
    slurm, cohort_root, stores, small_disk, tmp_path
):
    folder = tmp_path / "full"
    folder.mkdir()
    shutil.copytree(stores(CMU), small_disk / "stores" / f"a-{CMU}.ome.zarr")
    (folder / "stores").symlink_to(small_disk / "stores")
    store = small_disk / "stores" / f"a-{CMU}.ome.zarr"
    # the plan and the first shard fit, the second does not
    _tilestore("plan", store, "--mpp", "0.5", "--tile", "224")  # as embed would make it
    before = _files(store)
    filler = fill(small_disk, leave_kb=150)
    script = folder / "embed.sbatch"
    script.write_text(array_script(1).replace(CPU_FLAGS, f"{CPU_FLAGS} --plan 0.5mpp-224px"))
    job = slurm.sbatch(script, cwd=folder)
    slurm.wait(job, timeout=300)
    assert slurm.exit_codes(job) == {f"{job}_0": "FAILED 2:0"}, _log(slurm, folder)
    log = (folder / f"slurm-{job}_0.out").read_text()
    errors = [line for line in log.splitlines() if "error" in line]
    # the disk fills at a shard, or (its positions and plan group written first) as the
    # group is made: either way one line naming the group, never an internal error
    assert len(errors) == 1, errors
    assert re.search(
        rf"a-{re.escape(CMU)}\.ome\.zarr: writing embeddings/{LITE}/"
        r"0\.5mpp-224px( \(its shard \d+\))?: No space left on device; free space \(or raise "
        r"the quota\), then run the same command",
        errors[0],
    ), errors[0]
    after = _files(store)
    assert {k: after[k] for k in before} == before  # nothing the store had was touched
    # what was written is kept: the shards before the full one (none where the disk filled
    # as the group was made, its plan's group and positions written first)
    done = _done_tiles([store])
    filler.unlink()
    job = slurm.sbatch(script, cwd=folder)
    slurm.wait(job, timeout=300)
    assert slurm.exit_codes(job) == {f"{job}_0": "COMPLETED 0:0"}, _log(slurm, folder)
    if done:
        assert f"({done} done before)" in (folder / f"slurm-{job}_0.out").read_text()
    _assert_equal_to_reference(folder / "stores", cohort_root / "reference")


def test_a_full_disk_stops_its_stores_at_once_and_the_task_finishes_the_others(
    slurm, stores, small_disk, tmp_path
):
    """A task's share of three stores, two on a node's disk that fills as they are written,
    one elsewhere. The first of the two to meet the full disk fails in one line, nothing of
    it lost that was done; the other is not attempted where it was not begun (named, none
    of its batches done), fails on its own full disk in one line where it was (a store is
    opened, its group made, while the one before computes; on a busy machine the second's
    group may meet the full disk first), or completes where the space a failed group left
    is enough. The third completes; the task exits 3 (some complete), and its report counts
    them, a line a failed store."""
    folder = tmp_path / "three"
    (folder / "stores").mkdir(parents=True)
    for name in ("a", "b"):  # on the small disk, seen from the cohort's folder
        shutil.copytree(stores(CMU), small_disk / f"{name}-{CMU}.ome.zarr")
        (folder / "stores" / f"{name}-{CMU}.ome.zarr").symlink_to(
            small_disk / f"{name}-{CMU}.ome.zarr"
        )
    shutil.copytree(stores(CMU), folder / "stores" / f"c-{CMU}.ome.zarr")
    paths = sorted((folder / "stores").glob("*.ome.zarr"))
    for store in paths:
        _tilestore("plan", store, "--mpp", "0.5", "--tile", "224")
    names = [str(p.relative_to(folder)) for p in paths]
    other = names[2]
    fill(small_disk, leave_kb=150)  # the first group and maybe a shard fit, no more
    script = folder / "embed.sbatch"
    script.write_text(array_script(1).replace(CPU_FLAGS, f"{CPU_FLAGS} --plan 0.5mpp-224px"))
    job = slurm.sbatch(script, cwd=folder)
    slurm.wait(job, timeout=300)
    assert slurm.exit_codes(job) == {f"{job}_0": "FAILED 3:0"}, _log(slurm, folder)
    log = (folder / f"slurm-{job}_0.out").read_text()
    errors = [line for line in log.splitlines() if "error" in line]
    said = "\n".join(errors)  # whole lines, where an assertion below shows them
    full_line = (
        r"{}: writing embeddings/{}/0\.5mpp-224px( \(its shard \d+\))?: No space left on "
        r"device; free space \(or raise the quota\), then run the same command"
    )
    skipped_line = (
        r"{}: not attempted: its file system is full \(writing into \S+ failed: No space "
        r"left on device\); free space \(or raise the quota\), then run the same command$"
    )
    lines = {}  # each store of the full disk that failed -> how its line says it
    for error in errors:
        kinds = [
            (name, kind)
            for name in names[:2]
            for kind, pattern in (("full", full_line), ("skipped", skipped_line))
            if re.search(pattern.format(re.escape(name), LITE), error)
        ]
        assert len(kinds) == 1, said  # every line a store of the full disk's, in one line
        name, kind = kinds[0]
        assert name not in lines, said  # one line a store
        lines[name] = kind
        if "nothing was written" in error:  # its group removed: none of its batches kept
            assert _done_tiles([paths[names.index(name)]]) == 0, said
    assert "full" in lines.values(), said  # a store met the full disk itself
    report = json.loads((folder / "run-0.json").read_text())
    assert sorted((f["store"], f["cause"]) for f in report["failures"]) == [
        (name, "ENOSPC") for name in sorted(lines)
    ], said
    for name, path in zip(names[:2], paths[:2], strict=True):
        if lines.get(name) == "skipped":
            assert _done_tiles([path]) == 0  # not attempted: nothing of it written
        elif name not in lines:  # it completed in the space a failed group left
            assert _features(path)[1]["complete"], said
    assert other in [s["store"] for s in report["slides"] if not s.get("failed")]
    assert _features(paths[2])[1]["complete"]


def test_a_blocked_group_path_fails_its_store_in_one_line_and_the_task_finishes_the_other(
    slurm, cohort_root, stores, tmp_path
):
    """A file where a store's embeddings/<model> must be (left by hand, or immutable): that
    store fails in one line naming the file, never an internal error; the share's other
    store completes; the task exits 3 and its report says both."""
    folder = tmp_path / "blocked"
    blocked, good = _copy_stores(stores, folder / "stores", copies="a")
    (blocked / "embeddings").mkdir()
    (blocked / "embeddings" / LITE).write_text("in the way")
    script = folder / "embed.sbatch"
    script.write_text(array_script(1))
    job = slurm.sbatch(script, cwd=folder)
    slurm.wait(job, timeout=600)
    assert slurm.exit_codes(job) == {f"{job}_0": "FAILED 3:0"}, _log(slurm, folder)
    log = (folder / f"slurm-{job}_0.out").read_text()
    assert "internal error" not in log
    errors = [line for line in log.splitlines() if line.startswith("tilestore: error")]
    name = f"stores/{blocked.name}"  # as the script names it
    assert len(errors) == 1 and re.fullmatch(
        rf"tilestore: error: {re.escape(name)}: writing embeddings/{LITE}/[^:]+: Not a "
        rf"directory \({re.escape(name)}/embeddings/{LITE} is a file where a folder must be\); "
        r"move that file aside, then run the same command: what was written before is kept",
        errors[0],
    ), errors
    report = json.loads((folder / "run-0.json").read_text())
    assert [(f["store"], f["cause"]) for f in report["failures"]] == [(name, "ENOTDIR")]
    assert report["finished"] == [f"stores/{good.name}"]
    assert (report["outcome"], report["exit_code"]) == ("partial", 3)
    assert _features(good)[1]["complete"]


# -- a lock left by a dead node -----------------------------------------------------------------


def test_an_array_task_takes_over_the_lock_a_dead_node_left_and_completes(
    slurm, cohort_root, stores, tmp_path
):
    """A task requeued onto another node after a node failure finds the lock its first run
    left, naming that node: silent past `locks.STALE`, it is taken over with one line."""
    from tilestore.embeddings.write import lock_file

    folder = tmp_path / "dead-node"
    paths = _copy_stores(stores, folder / "stores", copies="a")
    store = paths[0]
    lock = lock_file(store, group_of(cohort_root / "reference" / store.name, LITE))
    now = time.time()
    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t))  # noqa: E731
    lock.write_text(json.dumps({"host": "node12", "pid": 4711, "since": iso(now - 3600),
                                "beat": iso(now - 600)}))  # fmt: skip
    script = folder / "embed.sbatch"
    script.write_text(array_script(1))
    job = slurm.sbatch(script, cwd=folder)
    slurm.wait(job, timeout=600)
    assert slurm.exit_codes(job) == {f"{job}_0": "COMPLETED 0:0"}, _log(slurm, folder)
    log = (folder / f"slurm-{job}_0.out").read_text()
    said = [line for line in log.splitlines() if line.startswith("tilestore: warning:")]
    assert len(said) == 1 and re.fullmatch(
        rf"tilestore: warning: {re.escape(store.name)}: took over the lock of node12:4711 "
        rf"\(no heartbeat for 1\d min\): stores/{re.escape(lock.name)}",  # as the script names it
        said[0],
    ), said
    assert not lock.exists()
    _assert_equal_to_reference(folder / "stores", cohort_root / "reference")


# -- reports: empty shares, a requeued task with nothing left, a report that cannot be written ---


def _imports_torch(log: str) -> bool:
    """Whether a task's log (`PYTHONPROFILEIMPORTTIME=1`: Python's import times) shows torch."""
    return any(line.rstrip().endswith("| torch") for line in log.splitlines())


def _timed(script: str) -> str:
    """The array script with Python's import times in each task's log."""
    return script.replace(
        "\ntilestore embed", "\nexport PYTHONPROFILEIMPORTTIME=1\ntilestore embed"
    )


def test_empty_shares_end_without_torch_with_their_reports_and_a_requeue_rewrites_them(
    slurm, cohort_root, stores, tmp_path
):
    """An array larger than its cohort (4 tasks, 2 stores): the two empty tasks complete,
    each with its report, and never import torch. Requeued once all is done, every task
    finds its share complete (skipped, still without torch) and replaces its report: no
    previous attempt's report is left to be read as this one's."""
    folder = tmp_path / "shares"
    paths = _copy_stores(stores, folder / "stores", copies="a")
    script = folder / "embed.sbatch"
    script.write_text(_timed(array_script(4)))
    job = slurm.sbatch(script, cwd=folder)
    slurm.wait(job, timeout=600)
    tasks = [f"{job}_{k}" for k in range(4)]
    assert slurm.exit_codes(job) == dict.fromkeys(tasks, "COMPLETED 0:0"), _log(slurm, folder)
    logs = [(folder / f"slurm-{task}.out").read_text() for task in tasks]
    reports = [json.loads((folder / f"run-{k}.json").read_text()) for k in range(4)]
    embedded = sorted(Path(s["store"]).name for r in reports for s in r["slides"])
    assert embedded == [p.name for p in paths]
    for k in (0, 1):  # a store each: the model loaded (the import times do show torch)
        assert reports[k]["outcome"] == "complete" and len(reports[k]["finished"]) == 1
        assert _imports_torch(logs[k]), logs[k][-2000:]
    for k in (2, 3):  # empty
        assert f"shard {k}/4: 0 store(s)" in logs[k]
        assert not _imports_torch(logs[k]), logs[k][-2000:]
        assert (reports[k]["outcome"], reports[k]["exit_code"]) == ("complete", 0)
        assert reports[k]["share"] == {"k": k, "n": 4, "stores": 0, "of": 2}
        assert reports[k]["notes"] == [f"share {k}/4 is empty: the 2 store(s) given fall to "
                                       "the others"]  # fmt: skip
    slurm.run("scontrol", "requeue", str(job))  # every task again, its share complete
    slurm.wait(job, timeout=600)
    assert slurm.exit_codes(job) == dict.fromkeys(tasks, "COMPLETED 0:0"), _log(slurm, folder)
    for task in tasks:
        assert "Restarts=1" in slurm.run("scontrol", "-o", "show", "job", task).stdout
    again = [json.loads((folder / f"run-{k}.json").read_text()) for k in range(4)]
    for k in (0, 1):  # the requeued attempt's report, not the first one's
        assert again[k]["slides"] == [] and again[k]["outcome"] == "complete"
        assert [s["store"] for s in again[k]["skipped"]] == reports[k]["finished"]
    for k in range(4):
        log = (folder / f"slurm-{job}_{k}.out").read_text()  # the requeued attempt's
        assert not _imports_torch(log), log[-2000:]  # complete stores: no model loaded
    _assert_equal_to_reference(folder / "stores", cohort_root / "reference")


def test_a_report_the_disk_cannot_hold_is_a_warning_and_the_task_completes(
    slurm, cohort_root, stores, small_disk, tmp_path
):
    """The report's folder is on a disk full by the end of the run: the store embedded
    stays complete, the task COMPLETED 0:0, one warning line names the report."""
    folder = tmp_path / "full-report"
    folder.mkdir()
    shutil.copytree(stores(IHC, mpp=0.5), folder / "stores" / f"a-{IHC}.ome.zarr")
    report = small_disk / "run-0.json"
    script = folder / "embed.sbatch"
    script.write_text(array_script(1).replace('--report "run-', f'--report "{small_disk}/run-'))
    fill(small_disk, leave_kb=0)
    job = slurm.sbatch(script, cwd=folder)
    slurm.wait(job, timeout=300)
    assert slurm.exit_codes(job) == {f"{job}_0": "COMPLETED 0:0"}, _log(slurm, folder)
    log = (folder / f"slurm-{job}_0.out").read_text()
    said = [line for line in log.splitlines() if line.startswith("tilestore:")]
    assert said == [
        f"tilestore: warning: {report}: the run's report was not written (No space left on "
        "device); the run's outcome stands as its exit status says"
    ]
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]  # no part left
    _assert_equal_to_reference(folder / "stores", cohort_root / "reference")
