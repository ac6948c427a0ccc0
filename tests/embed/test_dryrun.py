"""`embed --dry-run`: the tiles a run would embed, those already done, an estimate, and
nothing written."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.conftest import CMU
from tilestore.embed.dryrun import dry_run
from tilestore.embed.engine import embed
from tilestore.embed.settings import Options
from tilestore.plan import PlanOptions

FP32 = Options(batch_size=2, device="cpu", precision="fp32", dtype="float32")
PLAN = PlanOptions(mpp=1.0, tile=224)


def _tree(path):
    return sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*"))


def test_a_dry_run_counts_what_a_run_would_embed_and_writes_nothing(
    store, lite, slide_path, tmp_path
):
    fresh, begun, finished = store(), store(into=tmp_path / "b"), store(into=tmp_path / "c")
    embed([begun], lite, plan=PLAN, options=replace(FP32, max_tiles=3))
    embed([finished], lite, plan=PLAN, options=FP32)
    before = {p: _tree(p) for p in (fresh, begun, finished)}
    missing = tmp_path / "missing.ome.zarr"
    result = dry_run(
        [fresh, begun, finished, slide_path(CMU), missing],
        lite,
        plan=PLAN,
        options=FP32,
        convert_into="stores",  # as the command's default --into
    )
    assert {p: _tree(p) for p in before} == before  # not a tissue mask, not a plan
    assert not (tmp_path / "stores").exists()
    new, resumed, complete, slide, absent = result.rows
    assert (new.tiles, new.done, new.todo) == (11, 0, 11) and new.seconds > 0
    assert "tissue mask computed" in new.note and "(not stored)" in new.note
    assert (resumed.tiles, resumed.done, resumed.todo) == (11, 4, 7)
    assert resumed.note == "resumes: 2 batches done"
    assert (complete.done, complete.todo) == (11, 0) and "already complete" in complete.note
    assert slide.tiles is None and "would be converted into stores/CMU-1-Small-Region" in slide.note
    assert "no such store" in absent.error
    assert result.todo == 18 and result.tiles_per_s > 0 and result.batch_size == 2
    assert (result.decode, result.decode_why) == ("cpu", "no CUDA device")
    assert result.seconds == pytest.approx(18 / result.tiles_per_s)
    side = tmp_path / "side"
    (placed,) = dry_run(
        [slide_path(CMU)], lite, plan=PLAN, options=FP32, in_place=True, sidecars=side
    ).rows  # as embed() does
    assert (
        placed.note == f"a slide: would be read in place ({side / CMU}.tilestore.zarr made first)"
    )
    assert not side.exists()
    (nowhere,) = dry_run([slide_path(CMU)], lite, plan=PLAN, options=FP32).rows
    assert "a slide file, not a store" in nowhere.error


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_dry_run_says_which_stores_the_gpu_cannot_decode(store, tmp_path):
    from tilestore.embed.models import load_model

    tiny = load_model("random:vit_small_patch16_224")  # random weights: no package needed
    jpeg, zstd = store(into=tmp_path / "j"), store(codec="zstd", into=tmp_path / "z")
    options = Options(batch_size=2, decode="both", dtype="float32")
    result = dry_run([jpeg, zstd], tiny, plan=PLAN, options=options)
    assert result.decode == "both" and result.decode_why == "asked for"
    on_gpu, on_cpu = result.rows
    assert "decoded on" not in on_gpu.note  # as the run's line says: decode both
    assert "decoded on the CPU (its chunks are not JPEG" in on_cpu.note
