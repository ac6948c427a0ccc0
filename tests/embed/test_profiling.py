"""Looking inside a run: NVTX ranges named by stage, a torch.profiler trace, and a trial run
of each slide's first tiles (--max-tiles) that a later run finishes."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import numpy as np
import pytest
import zarr

from tests.conftest import group_of
from tilestore.embed import nvtx
from tilestore.embed.engine import embed
from tilestore.embed.report import format_report
from tilestore.embed.settings import Options
from tilestore.plan import PlanOptions

LITE = "efficientnet-lite0"
FP32 = Options(batch_size=2, device="cpu", precision="fp32", dtype="float32")
PLAN = PlanOptions(mpp=1.0, tile=224)


def _group(store):
    return zarr.open_group(store / group_of(store, LITE), mode="r")


def test_a_trial_run_embeds_the_first_batches_and_a_later_run_finishes(store, lite):
    trial = store()
    full = store(into=trial.parent / "full")
    report = embed([trial], lite, plan=PLAN, options=replace(FP32, max_tiles=3))
    assert report.tiles == 4  # 3 tiles, rounded up to whole batches of 2
    (slide,) = report.slides  # what is left is said as left, not as done
    assert (slide["skipped_done"], slide["left"]) == (0, 7)
    (line,) = [line for line in format_report(report) if str(trial) in line]
    assert "4 tiles" in line and "7 still to do: run again without --max-tiles" not in line
    assert "7 still to do: run again without max_tiles=<n> to finish" in line
    group = _group(trial)
    assert not group.attrs["tilestore"].get("complete")  # a trial does not finish the slide
    assert group["done"][:].tolist()[:3] == [1, 1, 0]
    again = embed([trial], lite, plan=PLAN, options=replace(FP32, max_tiles=3))
    assert again.tiles == 0  # the same trial again: its batches are done, as it said
    rest = embed([trial], lite, plan=PLAN, options=FP32)
    assert rest.tiles == 11 - 4 and _group(trial).attrs["tilestore"]["complete"]
    assert (rest.slides[0]["skipped_done"], rest.slides[0]["left"]) == (4, 0)
    embed([full], lite, plan=PLAN, options=FP32)
    np.testing.assert_array_equal(_group(trial)["features"][:], _group(full)["features"][:])


def test_a_torch_trace_of_some_batches(store, lite, tmp_path):
    out = tmp_path / "trace.json"
    options = replace(FP32, batch_size=1, profile="torch", profile_out=str(out), profile_batches=3)
    report = embed([store()], lite, plan=PLAN, options=options)
    assert report.tiles == 11
    events = json.loads(out.read_text())["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"}  # after 2 + 2
    names = {e.get("name") for e in events}  # our stages, by name, from every thread
    assert {"wait for tiles", "forward (preprocess, model)", "D2H copy"} <= names


class _Recorder:
    """Stands in for the NVTX library: each thread's pushes and pops, in order."""

    def __init__(self):
        self.events: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def push(self, name):
        with self.lock:
            self.events.append((threading.current_thread().name, "push", name))

    def pop(self):
        with self.lock:
            self.events.append((threading.current_thread().name, "pop", ""))

    def name_thread(self, name):
        pass


def test_nvtx_ranges_name_every_stage_and_nest_per_thread(store, lite, monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(nvtx, "load", lambda: recorder)
    report = embed([store()], lite, plan=PLAN, options=replace(FP32, profile="nvtx"))
    assert report.tiles == 11
    names = {name for _, kind, name in recorder.events if kind == "push"}
    assert {
        "wait for tiles",
        "read",
        "decode",
        "cut",
        "forward (preprocess, model)",
        "D2H copy",
        "write",
    } <= names
    depth: dict[str, int] = {}
    for thread, kind, _ in recorder.events:  # every range closed on the thread it opened on
        depth[thread] = depth.get(thread, 0) + (1 if kind == "push" else -1)
        assert depth[thread] >= 0
    assert set(depth.values()) == {0}


def test_nvtx_asked_for_without_the_library_is_one_clear_error(store, lite, monkeypatch):
    monkeypatch.setattr(nvtx, "load", lambda: None)
    with pytest.raises(Exception, match="--profile nvtx: no NVTX library found"):
        embed([store()], lite, plan=PLAN, options=replace(FP32, profile="nvtx"))


def test_the_nvtx_library_loads_where_installed():
    marks = nvtx.load()
    if marks is None:
        pytest.skip("no NVTX library here (CPU torch without nvidia-nvtx)")
    assert isinstance(marks, nvtx.Nvtx)
    marks.push("tilestore test")  # outside a profiler: a no-op that must not crash
    marks.push("tilestore test")
    marks.pop()
    marks.pop()
    assert marks._names == {"tilestore test": b"tilestore test"}  # encoded once, then reused


def test_without_the_nvtx_library_nothing_is_marked(monkeypatch, tmp_path):
    monkeypatch.setattr(nvtx, "_candidates", lambda: [tmp_path / "libnvtx3interop.so.1"])
    assert nvtx.load() is None
    not_nvtx = tmp_path / "libnot.so"
    not_nvtx.write_bytes(b"\x7fELF not a library")
    monkeypatch.setattr(nvtx, "_candidates", lambda: [not_nvtx])
    assert nvtx.load() is None
