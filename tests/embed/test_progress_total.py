"""A run's progress total is the cohort's from its first batch: counted up front from the
stores' stored plans and done batches, not summed as each store is planned; while a store
whose plan only the run makes is left, the total says it is a floor (`AtLeast`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tilestore.embed.engine import embed
from tilestore.embed.report import RunReport
from tilestore.embed.settings import Options
from tilestore.embeddings import plan_slide
from tilestore.plan import PlanOptions, resolve_plan, save_plan
from tilestore.progress import AtLeast
from tilestore.reading.opening import open_slide

PLAN = PlanOptions(mpp=0.5, tile=224)
OPTIONS = Options(device="cpu", batch_size=8, precision="fp32", dtype="float32")


def _planned(path):
    slide = open_slide(path)
    made = plan_slide(slide, resolve_plan(PLAN, slide))
    save_plan(slide, made)
    return len(made)


@pytest.fixture
def cohort(store, lite, tmp_path):
    """Three stores: one half embedded (a trial's first batch), one planned, one bare."""
    paths = [store(into=tmp_path / name) for name in ("begun", "planned", "bare")]
    embed([paths[0]], lite, plan=PLAN, options=replace(OPTIONS, max_tiles=8))
    tiles = _planned(paths[1])
    return paths, tiles


def _calls(record):
    return lambda n, total: record.append((n, total))


def test_the_first_progress_total_is_the_cohorts_tiles_to_do(cohort, lite):
    (begun, planned, _), tiles = cohort
    calls = []
    report = embed([begun, planned], lite, plan=PLAN, options=OPTIONS, progress=_calls(calls))
    assert report.tiles == 2 * tiles - 8  # the trial's batch is done already
    totals = {total for _, total in calls}
    assert totals == {report.tiles}  # from the first batch on, never growing
    assert not any(isinstance(t, AtLeast) for t in totals)
    assert sum(n for n, _ in calls) == report.tiles


def test_a_store_the_run_plans_makes_the_total_a_floor_until_it_is_planned(cohort, lite):
    (begun, planned, bare), tiles = cohort
    calls = []
    report = embed([begun, planned, bare], lite, plan=PLAN, options=OPTIONS, progress=_calls(calls))
    assert report.tiles == 3 * tiles - 8
    # the producer plans the bare store while the first batches are computed: before it
    # is planned a line shows the two known stores' tiles as a floor, after it the total
    floor, exact = 2 * tiles - 8, 3 * tiles - 8
    for _, total in calls:
        if isinstance(total, AtLeast):
            assert (int(total), total.stores) == (floor, 1)
        else:
            assert total == exact
    last = calls[-1][1]
    assert not isinstance(last, AtLeast) and last == report.tiles  # exact once planned
    assert np.all(np.diff([int(t) for _, t in calls]) >= 0)
    assert sum(n for n, _ in calls) == report.tiles


def test_the_total_is_a_floor_while_an_input_is_not_planned():
    report = RunReport({}, "cpu", "CPU", 8, "fp32", compile=False)
    report.expect({"a.ome.zarr": 40, "b.svs": None, "c.ome.zarr": 0})
    shown = report.progress_total()
    assert isinstance(shown, AtLeast) and (int(shown), shown.stores) == (40, 1)
    report.planned("b.svs", "stores/b.svs.ome.zarr", 25)
    assert report.progress_total() == 65 and not isinstance(report.progress_total(), AtLeast)
    report.planned("a.ome.zarr", "a.ome.zarr", 32)  # planned otherwise than counted
    assert report.progress_total() == 57
