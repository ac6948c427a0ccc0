"""Slides given to `embed` instead of stores: converted on the way in, one slide ahead, with
the same features as the four commands (convert, tissue, plan, embed) run one by one."""

from __future__ import annotations

import threading

import numpy as np
import zarr

from embed import inputs
from embed.engine import embed
from embed.inputs import Stager
from embed.settings import Options
from tests.conftest import CMU, NDPI
from tilestore.conversion import convert
from tilestore.plans import PlanOptions

LITE = "efficientnet-lite0"
FP32 = Options(batch_size=8, device="cpu", precision="fp32", dtype="float32")
PLAN = PlanOptions(mpp=1.0, tile=224)


def _features(store):
    return zarr.open_group(store / "embeddings" / LITE, mode="r")["features"][:]


def test_a_slide_given_equals_the_four_commands(slide_path, tmp_path, lite):
    svs = slide_path(CMU)
    report = embed([svs], lite, plan=PLAN, options=FP32, convert_into=tmp_path / "in")
    assert not report.failures
    (done,) = report.converted
    assert done["levels"] == ["copy", "re-encode"] and done["codec"] == "jpeg"
    made = tmp_path / "in" / "CMU-1-Small-Region.ome.zarr"
    assert report.slides[0]["store"] == str(made)
    by_hand = convert(svs, tmp_path / "by-hand").store
    embed([by_hand], lite, plan=PLAN, options=FP32)
    np.testing.assert_array_equal(_features(made), _features(by_hand))  # bitwise, fp32 CPU
    # again: the store there is the slide's: reused, not converted; the embedding is done
    again = embed([svs], lite, plan=PLAN, options=FP32, convert_into=tmp_path / "in")
    assert again.converted == [{"slide": str(svs), "store": str(made), "reused": True}]
    assert "is already complete" in again.skipped[0]["why"]


def test_a_store_of_another_slide_is_not_taken_for_it(slide_path, tmp_path, lite, store):
    into = tmp_path / "in"
    impostor = store(NDPI, into=into)  # the DAPI slide's store, under the SVS's store name
    impostor.rename(into / "CMU-1-Small-Region.ome.zarr")
    bad = tmp_path / "bad.svs"
    bad.write_bytes(slide_path(CMU).read_bytes()[:50_000])  # cut: a truncated slide
    report = embed(
        [slide_path(CMU), bad, store()], lite, plan=PLAN, options=FP32, convert_into=into
    )
    first, second = report.failures
    assert first["store"] == str(slide_path(CMU))
    assert "already holds another slide (stritt_test3-DAPI-2-387.ndpi" in first["error"]
    assert second["store"] == str(bad) and "truncated" in second["error"]
    assert not (into / "bad.ome.zarr").exists()  # nothing that looks valid is left
    assert len(report.slides) == 1  # the store given as a store is embedded


def test_the_next_slide_converts_while_this_one_is_used(tmp_path, monkeypatch):
    started, release = [], threading.Event()

    def slow_convert(slide, target):
        started.append(slide.name)
        if slide.name == "b.svs":
            release.wait(10)
        target.mkdir(parents=True)
        (target / "zarr.json").write_text("{}")
        return type("Report", (), {"store": target, "levels": [], "codec": "jpeg"})()

    monkeypatch.setattr(inputs, "convert", slow_convert)
    paths = [tmp_path / n for n in ("a.svs", "b.svs", "c.svs")]
    for path in paths:
        path.write_bytes(b"slide")
    stager = Stager(paths, tmp_path / "in")
    items = iter(stager)
    first = next(items)  # a is done; b converts while a is used; c is not asked for yet
    assert first.given == paths[0] and first.store == tmp_path / "in" / "a.ome.zarr"
    for _ in range(200):
        if len(started) == 2:
            break
        threading.Event().wait(0.01)
    assert started == ["a.svs", "b.svs"]  # one slide ahead, not all of them
    release.set()
    assert [s.given.name for s in items] == ["b.svs", "c.svs"]
    assert started == ["a.svs", "b.svs", "c.svs"]
