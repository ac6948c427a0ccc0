"""Write-back: the embeddings group is made late, resumed from its done batches, replaced
only when a run starts writing."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from tests.conftest import group_of
from tilestore.embeddings import AlreadyComplete, EmbeddingWriter, RunIdentity
from tilestore.errors import EmbeddingError
from tilestore.plan import PlanOptions, plan_over_tissue, save_plan
from tilestore.reading.opening import open_slide

MODEL = {"name": "test-model", "output_dim": 4}


@pytest.fixture
def slide_plan(store):
    path = store()
    slide = open_slide(path)
    plan = plan_over_tissue(slide, PlanOptions(mpp=1.0, tile=224, min_tissue=0.0))
    return slide, plan, save_plan(slide, plan), path


def _writer(slide_plan, **kwargs) -> EmbeddingWriter:
    slide, plan, uid, _ = slide_plan
    identity = RunIdentity(MODEL, batch_size=4, dtype="float32", precision="fp32", compile=False)
    return EmbeddingWriter(slide, plan, uid, identity, **kwargs)


def _group(slide_plan):
    return zarr.open_group(slide_plan[3] / group_of(slide_plan[3], "test-model"), mode="r")


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


def _sharded(slide_plan, shard_tiles: int = 8, **kwargs) -> EmbeddingWriter:
    slide, plan, uid, _ = slide_plan
    identity = RunIdentity(
        MODEL,
        batch_size=4,
        dtype="float32",
        precision="fp32",
        compile=False,
        shard_tiles=shard_tiles,
    )
    return EmbeddingWriter(slide, plan, uid, identity, **kwargs)


def test_features_and_done_are_one_file_per_shard_of_whole_batches(slide_plan):
    writer = _sharded(slide_plan, shard_tiles=10)  # 10 tiles: 2 whole batches of 4
    assert writer.per_shard == 2 and writer.blocks >= 5
    _fill(writer, writer.todo(), 1.0)
    writer.finish({})
    group = _group(slide_plan)
    assert group["features"].shards == (8, 4) and group["features"].chunks == (4, 4)
    assert group["done"].shards == (2,)
    shards = -(-writer.blocks // 2)
    folder = slide_plan[3] / group_of(slide_plan[3], "test-model")
    for name in ("features", "done"):
        assert len([p for p in (folder / name / "c").rglob("*") if p.is_file()]) == shards
    for name in ("x", "y", "tissue"):  # each coordinate column is one file
        assert len([p for p in (folder / name).rglob("*") if p.is_file()]) == 2  # + zarr.json


def test_a_batch_is_done_only_once_its_shard_is_written(slide_plan):
    writer = _sharded(slide_plan)
    _fill(writer, [0], 5.0)
    group = _group(slide_plan)
    assert group["done"][:].sum() == 0 and np.isnan(group["features"][:4]).all()  # waits
    _fill(writer, [1], 6.0)  # the shard's last batch to do: the shard is written, then done
    group = _group(slide_plan)
    assert group["done"][:2].tolist() == [1, 1] and group["done"][2:].sum() == 0
    assert (group["features"][:4] == 5.0).all() and (group["features"][4:8] == 6.0).all()
    writer.abandon()


def test_a_shard_with_done_batches_keeps_them_when_the_rest_is_written(slide_plan):
    first = _sharded(slide_plan)
    _fill(first, [2], 7.0)  # half of shard 1
    assert first.abandon().startswith("1 of")  # written at the end: it is kept
    group = _group(slide_plan)
    assert group["done"][:].tolist()[:4] == [0, 0, 1, 0]
    before = (slide_plan[3] / group_of(slide_plan[3], "test-model") / "features/c/1/0").read_bytes()
    resumed = _sharded(slide_plan, create=False)
    assert 2 not in resumed.todo()
    _fill(resumed, [3], 8.0)  # completes shard 1: read back, batch 2 kept as it was
    group = _group(slide_plan)
    assert (group["features"][8:12] == 7.0).all() and (group["features"][12:16] == 8.0).all()
    after = (slide_plan[3] / group_of(slide_plan[3], "test-model") / "features/c/1/0").read_bytes()
    assert after != before and group["done"][:4].tolist() == [0, 0, 1, 1]
    _fill(resumed, resumed.todo(), 9.0)
    resumed.finish({})
    group = _group(slide_plan)
    assert group.attrs["tilestore"]["complete"] and (group["features"][8:12] == 7.0).all()


def test_features_written_before_a_kill_but_not_marked_done_are_redone(slide_plan, monkeypatch):
    writer = _sharded(slide_plan)
    done = writer._done

    class Killed(Exception):
        pass

    class DiesMarking:  # the shard's features are written; the process dies before its flags
        shape, dtype = done.shape, done.dtype

        def __getitem__(self, key):
            return done[key]

        def __setitem__(self, key, value):
            raise Killed

    monkeypatch.setattr(writer, "_done", DiesMarking())
    with pytest.raises(Killed):
        _fill(writer, [0, 1], 4.0)
    monkeypatch.undo()
    writer._release_lock()
    assert (_group(slide_plan)["features"][:8] == 4.0).all()
    resumed = _sharded(slide_plan, create=False)
    assert resumed.todo().tolist()[:2] == [0, 1]  # not done: computed again


def test_files_a_killed_writer_left_unrenamed_are_cleared_on_resume(slide_plan):
    first = _sharded(slide_plan)
    _fill(first, [0, 1], 1.0)
    first.abandon()
    shard = slide_plan[3] / group_of(slide_plan[3], "test-model") / "features/c/0/0"
    torn = shard.with_suffix(".0123456789abcdef0123456789abcdef.partial")
    torn.write_bytes(shard.read_bytes()[:10])  # what zarr's local store was writing
    resumed = _sharded(slide_plan, create=False)
    assert not torn.exists() and resumed.todo().tolist()[0] == 2
    resumed.abandon()


UNSEEDED = {**MODEL, "weights": "random", "weights_sha256": None}  # timm:<arch> without weights


def test_a_group_of_unknown_weights_is_never_resumed(slide_plan):
    """A second run of timm:<arch> without its weights finished the store with other random
    weights (cosine 0.015 between the two runs' features of the same tiles). Now a group
    made with random weights drawn without a seed is refused, by any run, in one line."""
    slide, plan, uid, path = slide_plan
    first = EmbeddingWriter(slide, plan, uid, RunIdentity(UNSEEDED, 4, "float32", "fp32", False))
    _fill(first, [0], 1.0)
    first.abandon()  # killed: batch 0 done
    seeded = {**MODEL, "weights": "random", "weights_seed": 0, "weights_sha256": "a" * 64}
    for model in (UNSEEDED, seeded):
        with pytest.raises(EmbeddingError) as refused:
            EmbeddingWriter(slide, plan, uid, RunIdentity(model, 4, "float32", "fp32", False))
        assert str(refused.value) == (
            f"{slide.name}: an unfinished embeddings/test-model/{plan.name} was made with random "
            "weights drawn without a seed (weights unknown), which no run draws again: "
            f"embeddings/test-model/{plan.name} cannot be resumed; pass overwrite=True to embed "
            "it again"
        )
    assert not list(path.parent.glob(".*.lock"))  # refused: no lock left
    assert _group(slide_plan)["done"][:].sum() == 1  # kept as it was
    again = EmbeddingWriter(
        slide, plan, uid, RunIdentity(seeded, 4, "float32", "fp32", False), overwrite=True
    )
    assert again.todo().tolist() == list(range(again.blocks))  # embedded afresh
    again.abandon()


def test_seeded_random_weights_resume_only_the_same_draw(slide_plan):
    slide, plan, uid, _ = slide_plan
    drawn = {**MODEL, "weights": "random", "weights_seed": 0, "weights_sha256": "a" * 64}
    first = EmbeddingWriter(slide, plan, uid, RunIdentity(drawn, 4, "float32", "fp32", False))
    _fill(first, [0], 1.0)
    first.abandon()
    resumed = EmbeddingWriter(slide, plan, uid, RunIdentity(drawn, 4, "float32", "fp32", False))
    assert 0 not in resumed.todo()
    resumed.abandon()
    other = {**drawn, "weights_sha256": "b" * 64}  # the seed drawn on another kind of GPU
    with pytest.raises(EmbeddingError, match=r"made with other settings \(model\)"):
        EmbeddingWriter(slide, plan, uid, RunIdentity(other, 4, "float32", "fp32", False))


def test_the_plan_replaced_refusal_counts_each_plan_s_own_tiles(slide_plan):
    """The count next to the plan the group was made from is the tiles embedded of it; the
    run's plan of the same name, made again with a stride, has its own count beside it (it
    was left out where the refusal came before the run: "(45 tiles)" read as the plan's)."""
    from tilestore.embeddings.write import resume_state

    first = _writer(slide_plan)
    _fill(first, first.todo(), 1.0)
    first.finish({})
    slide, plan, _, _ = slide_plan
    again = plan_over_tissue(slide, PlanOptions(mpp=1.0, tile=224, stride=112, min_tissue=0.0,
                                          name=plan.name))  # fmt: skip
    uid = save_plan(slide, again, overwrite=True)
    assert len(again) > len(plan)
    found = resume_state(slide, MODEL["name"], again.name, uid, len(again))
    assert found.state == "other plan" and found.why == (
        f"{slide.name}: embeddings/test-model/{plan.name} was made from plan '{plan.name}' as it "
        "was before "
        f"it was made again ({len(plan)} tiles embedded), not this run's '{plan.name}' "
        f"({len(again)} tiles; a plan of the same name made again counts as another); pass "
        "overwrite=True to replace it"
    )
    # another plan's group of the model is made beside it: nothing to refuse
    other = resume_state(slide, MODEL["name"], "0.5mpp-224px", None, None)
    assert other.state == "new"


def test_a_removal_cut_short_leaves_no_group_to_resume(slide_plan, monkeypatch):
    """A group abandoned with nothing written is removed; a removal cut short (its process
    killed part way: a store process ends the moment its run is gone) must not leave the
    group's record with some of its arrays gone, which the rerun would resume and find
    damaged: the record goes first, and the rerun makes the group again."""
    from zarr.storage import LocalStore

    first = _writer(slide_plan)
    assert (slide_plan[3] / first.path / "tissue").is_dir()
    remove = LocalStore.delete_dir

    async def cut_short(self, prefix):  # the tissue column gone, then no more (killed)
        await remove(self, f"{prefix}/tissue")
        raise OSError(5, "cut short")

    monkeypatch.setattr(LocalStore, "delete_dir", cut_short)
    assert "stays empty" in first.abandon()  # what is left of it: no record
    monkeypatch.undo()
    assert not (slide_plan[3] / first.path / "tissue").exists()
    again = _writer(slide_plan)  # made again, not resumed and refused as damaged
    assert again.todo().tolist() == list(range(again.blocks))
    _fill(again, again.todo(), 2.0)
    again.finish({})
    assert _group(slide_plan)["tissue"][:].size == len(again.plan)
