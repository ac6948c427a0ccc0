"""Write-back: the embeddings group is made late, resumed from its done batches, replaced
only when a run starts writing."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from tilestore.embeddings import AlreadyComplete, EmbeddingWriter, RunIdentity
from tilestore.plan import PlanOptions, plan_slide, save_plan
from tilestore.reading.opening import open_slide

MODEL = {"name": "test-model", "output_dim": 4}


@pytest.fixture
def slide_plan(store):
    path = store()
    slide = open_slide(path)
    plan = plan_slide(slide, PlanOptions(mpp=1.0, tile=224, min_tissue=0.0))
    return slide, plan, save_plan(slide, plan), path


def _writer(slide_plan, **kwargs) -> EmbeddingWriter:
    slide, plan, uid, _ = slide_plan
    identity = RunIdentity(MODEL, batch_size=4, dtype="float32", precision="fp32", compile=False)
    return EmbeddingWriter(slide, plan, uid, identity, **kwargs)


def _group(slide_plan):
    return zarr.open_group(slide_plan[3] / "embeddings" / "test-model", mode="r")


def _fill(writer: EmbeddingWriter, blocks, value: float) -> None:
    n = len(writer.plan)
    for block in blocks:
        count = min(4, n - block * 4)
        writer.write(block, np.full((count, 4), value, np.float32))


def test_overwrite_keeps_the_old_embeddings_until_the_new_group_is_made(slide_plan):
    first = _writer(slide_plan)
    _fill(first, first.todo(), 1.0)
    first.finish({})
    with pytest.raises(AlreadyComplete):
        _writer(slide_plan, create=False)
    again = _writer(slide_plan, overwrite=True, create=False)
    assert again.todo().tolist() == list(range(again.blocks))
    old = _group(slide_plan)
    assert old.attrs["tilestore"]["complete"] and (old["features"][:] == 1.0).all()
    again.create()
    new = _group(slide_plan)
    assert not new.attrs["tilestore"]["complete"] and new["done"][:].sum() == 0
    assert np.isnan(new["features"][:]).all()
    again.abandon()


def test_a_resumed_group_is_opened_not_remade(slide_plan):
    first = _writer(slide_plan)
    assert first.blocks >= 3
    _fill(first, [0, 2], 2.0)
    first.abandon()  # killed: batches 0 and 2 are done
    resumed = _writer(slide_plan, create=False)
    assert resumed.todo().tolist() == [b for b in range(resumed.blocks) if b not in (0, 2)]
    resumed.create()  # nothing to make: the done batches stay
    assert (_group(slide_plan)["features"][:4] == 2.0).all()
    _fill(resumed, resumed.todo(), 3.0)
    resumed.finish({})
    group = _group(slide_plan)
    assert group.attrs["tilestore"]["complete"] and group["done"][:].all()
    assert not list(slide_plan[3].parent.glob(".*.lock"))
