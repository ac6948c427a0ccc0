"""Run report advice: the loud warnings people need when the GPU is idle or unused."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from tilestore.embed.report import COMPILE_WAIT, RunReport, Stats, advice, format_report


def _report(**kwargs) -> RunReport:
    base = {
        "model": {"name": "uni"},
        "device": "cuda:0",
        "device_name": "H100",
        "batch_size": 64,
        "precision": "bf16",
        "compile": False,
        "decode": "cpu",
        "tiles": 10_000,
        "wall_s": 10.0,
    }
    return RunReport(**{**base, **kwargs})


def test_idle_gpu_waiting_for_tiles_points_at_decoding():
    report = _report(
        gpu_busy_fraction=0.3, explained={"waiting for tiles (read/decode bound)": 6.0}
    )
    (note,) = advice(report)
    assert "busy only 30%" in note and "decoders=" in note and "decode='both'" in note


def test_idle_gpu_with_tiles_ready_points_at_the_batch_size():
    report = _report(
        gpu_busy_fraction=0.4,
        batch_size=16,
        explained={"waiting for tiles (read/decode bound)": 0.5},
    )
    (note,) = advice(report)
    assert "larger batch_size than 16" in note


def test_busy_gpu_needs_no_advice():
    assert advice(_report(gpu_busy_fraction=0.93, explained={})) == []


def test_cpu_run_with_cuda_present_is_loud(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    report = _report(device="cpu", gpu_busy_fraction=None)
    assert advice(report) == ["CUDA is available but the model ran on the CPU: pass device='cuda'"]


@pytest.mark.parametrize("busy", [0.2, 0.95])
def test_format_report_ends_with_the_warnings(busy):
    report = _report(
        gpu_busy_fraction=busy,
        explained={"GPU computing": 2.0},
        warnings=advice(_report(gpu_busy_fraction=busy, explained={})),
    )
    lines = format_report(report)
    assert lines[0].startswith("10000 tiles in 10.0 s = 1000.0 tiles/s on H100")
    assert any(line.startswith("WARNING") for line in lines) == (busy < 0.5)


@pytest.mark.parametrize(
    ("mode", "slides", "why", "shown"),
    [
        ("cpu", ["cpu"], "", "decode cpu)"),
        ("gpu", ["gpu", "gpu"], "", "decode gpu via nvJPEG, the JPEG engines)"),
        (
            "gpu",
            ["gpu", "cpu", "gpu"],
            "",
            "decode gpu via nvJPEG, the JPEG engines; 1 of 3 slides on the CPU alone)",
        ),
        ("gpu", ["cpu"], "", "decode gpu; 1 of 1 slides on the CPU alone)"),
        ("gpu", [], "", "decode gpu)"),
        (
            "both",
            ["both", "cpu"],
            "4 CPUs and 7 JPEG engines",
            "decode both via nvJPEG, the JPEG engines; 1 of 2 slides on the CPU alone "
            "(4 CPUs and 7 JPEG engines))",
        ),
    ],
)
def test_the_first_line_says_how_the_slides_were_decoded(mode, slides, why, shown):
    report = _report(
        decode=mode,
        decode_why=why,
        gpu_decoder="nvJPEG, the JPEG engines",
        slides=[
            {"store": f"s{i}", "tiles": 9, "skipped_done": 0, "decode": d}
            for i, d in enumerate(slides)
        ],
    )
    assert format_report(report)[0].endswith(shown)


def _finished(monkeypatch, wall: float, parts: dict, **kwargs) -> RunReport:
    """A GPU run's report finished from these stage seconds."""
    monkeypatch.setattr("torch.cuda.max_memory_allocated", lambda *a: 0)
    stats = Stats()
    for stage, seconds in parts.items():
        stats.add(stage, seconds)
    sampler = SimpleNamespace(rss_mb=100.0, gpu_mem_mb=0.0, gpu_util=[], nvml_error=None)
    report = _report(**kwargs)
    report.finish(wall, sampler, stats)
    return report


def test_a_compile_warm_up_is_reported_apart_not_as_an_idle_gpu(monkeypatch):
    parts = {"loop": 10.0, "warm_up": 6.0, "compute": 3.5, "waiting_for_tiles": 0.3}
    report = _finished(monkeypatch, 11.2, parts, setup_s=1.0)
    assert report.explained["model warm-up (CUDA set-up, compilation)"] == 6.0
    assert report.explained["other (launches, writer back-pressure)"] == pytest.approx(0.2)
    assert sum(report.explained.values()) == pytest.approx(11.2)
    assert report.gpu_busy_fraction == pytest.approx(3.5 / 4.0)  # of the loop after warm-up
    assert report.warnings == []


def test_a_wait_for_another_processs_compile_is_named_not_other(monkeypatch):
    """An array task waits 245 s for the task compiling the model's graphs (the compile
    cache), then loads them: a stage of its own in the wall time, not "other"."""
    parts = {"loop": 260.0, "compile_cache_wait": 245.0, "warm_up": 2.0, "compute": 12.0,
             "waiting_for_tiles": 0.5, "gpu_idle": 0.4}  # fmt: skip
    report = _finished(monkeypatch, 261.0, parts, setup_s=1.0, first_batch_s=247.5)
    assert report.explained[COMPILE_WAIT] == 245.0
    assert report.explained["model warm-up (CUDA set-up, compilation)"] == 2.0
    assert report.explained["other (launches, writer back-pressure)"] == pytest.approx(0.5)
    assert sum(report.explained.values()) == pytest.approx(261.0)
    assert report.gpu_busy_fraction == round(12.0 / 13.0, 3)  # of the loop after them
    shown = format_report(report)[1]
    assert f"{COMPILE_WAIT} 245.00 s" in shown
    assert "compile cache" not in format_report(_finished(monkeypatch, 11.2, {"loop": 10.0}))[1]


def test_waiting_that_overlaps_gpu_work_is_not_counted_twice(monkeypatch):
    """nvJPEG-bound: the loop waits 6 s for tiles, but the GPU computes through 4.5 s of it;
    only its idle time (fill + gaps between batches) is waiting, and the parts add up."""
    parts = {"loop": 10.0, "compute": 8.0, "waiting_for_tiles": 6.0, "gpu_idle": 1.5}
    report = _finished(monkeypatch, 10.5, parts, setup_s=0.5, first_batch_s=0.5)
    assert report.explained["waiting for tiles (read/decode bound)"] == pytest.approx(2.0)
    assert report.explained["GPU computing"] == 8.0
    assert sum(report.explained.values()) == pytest.approx(10.5)


def test_a_report_is_saved_into_a_folder_not_made_yet(tmp_path):
    path = tmp_path / "runs" / "today" / "run.json"
    _report(stages={"compute": 1.0}).save(path)
    saved = json.loads(path.read_text())
    assert saved["tiles"] == 10_000 and saved["stages"] == {"compute": 1.0}
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]  # no partial file left


def test_a_report_that_cannot_be_put_in_place_leaves_nothing_and_is_a_warning(
    tmp_path, monkeypatch
):
    """The run's outcome stands: the failure is a warning naming the report (not the
    temporary file it was written into) and the cause."""
    import errno

    from tilestore.embed import reportfile
    from tilestore.errors import TilestoreWarning

    def refuse(source, target):
        raise OSError(errno.EROFS, "Read-only file system", str(target))

    monkeypatch.setattr(reportfile.os, "replace", refuse)
    path = tmp_path / "run.json"
    with pytest.warns(TilestoreWarning) as said:
        assert _report().save(path) is False
    assert [str(w.message) for w in said] == [
        f"{path}: the run's report was not written (Read-only file system); the run's "
        "outcome stands as its exit status says"
    ]
    assert list(tmp_path.iterdir()) == []  # neither the report nor its partial copy


def test_a_cpu_run_names_the_cores_it_may_run_on_not_the_machines(monkeypatch):
    """Under taskset or a SLURM job's share, the report says how many of the machine's cores
    the run had (it said the machine's count, however few the job was given)."""
    import os

    from tilestore.embed import report

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(report, "usable_cpus", lambda: 2)
    assert report._cpu_name().startswith("CPU (2 of 64 cores, ")
    monkeypatch.setattr(report, "usable_cpus", lambda: 64)
    assert report._cpu_name().startswith("CPU (64 cores, ")


def test_before_the_engine_counts_from_the_process_start():
    """The report's "before the engine" is the process's own age: read as a process's first
    statement it is only the interpreter's start, never late by the boot time's fraction of
    a second (/proc/stat says the boot time in whole seconds, and psutil's create_time adds
    it: 0.87 s more on the machine where this was found, a constant per host)."""
    code = (
        "import time; first = time.perf_counter()\n"
        "import os\n"
        "from tilestore.embed.engine import _since_process_start\n"
        "print(_since_process_start(first), time.perf_counter() - first, flush=True)\n"
        "os._exit(0)"
    )
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    before, after = map(float, run.stdout.split())
    assert before >= 0 and before + after <= wall + 0.02  # the start's clock tick (10 ms)


def test_the_first_line_says_when_the_weights_are_random():
    """The run's line is the user's view of its model: random weights (random:, seeded) are
    said there, with the seed and which draw; a checkpoint's run says nothing of it."""
    drawn = {"name": "random:vit_tiny_patch16_224", "weights": "random", "weights_seed": 0,
             "weights_sha256": "1b10fd2e86a30632" + "0" * 48}  # fmt: skip
    first = format_report(_report(model=drawn))[0]
    assert first.endswith(
        "; random:vit_tiny_patch16_224: RANDOM weights (seed 0, sha256 1b10fd2e86a3), not a "
        "trained model's features"
    )
    unseeded = {**drawn, "weights_seed": None}  # as timm:<arch> without its weights drew them
    assert format_report(_report(model=unseeded))[0].endswith(
        "; random:vit_tiny_patch16_224: RANDOM weights drawn without a seed (weights unknown)"
    )
    trained = {"name": "uni", "weights": "/cache/model.safetensors", "weights_sha256": "a" * 64}
    assert "RANDOM" not in format_report(_report(model=trained))[0]
