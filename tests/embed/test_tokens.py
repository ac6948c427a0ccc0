"""--tokens: each tile's patch-token grid stored beside its features, pooled as asked."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import zarr

from tests.conftest import group_of
from tilestore.embed.engine import embed
from tilestore.embed.models import ModelError, load_model
from tilestore.embed.reference import reference_features
from tilestore.embed.settings import Options
from tilestore.embeddings import open_embeddings
from tilestore.errors import TilestoreError
from tilestore.plan import PlanOptions, load_plan
from tilestore.reading.opening import open_slide

TINY = "random:vit_tiny_patch16_224"
PLAN = PlanOptions(mpp=1.0, tile=224)
FP32 = Options(batch_size=8, device="cpu", precision="fp32", dtype="float32")


@pytest.fixture(scope="module")
def tiny():
    return load_model(TINY)  # random weights, drawn once: every run here uses these


def _group(path):
    return zarr.open_group(path / group_of(path, TINY), mode="r")


@pytest.mark.parametrize(("grid", "side"), [(2, 2), ("model", 14)])
def test_tokens_are_the_models_grid_pooled_as_asked(store, tiny, grid, side):
    path = store()
    embed([path], tiny, plan=PLAN, options=replace(FP32, tokens=grid))
    group = _group(path)
    tokens, features = group["tokens"], group["features"][:]
    assert tokens.shape == (features.shape[0], side, side, 192)
    assert tokens.metadata.dimension_names == ("tile", "token_y", "token_x", "token_feature")
    assert group.attrs["tilestore"]["tokens"] == {
        "grid": [side, side], "dim": 192, "model_grid": [14, 14], "pooling": "mean"
    }  # fmt: skip
    slide = open_slide(path)
    plan, _ = load_plan(slide)
    picks = [0, len(plan) // 2, len(plan) - 1]
    want = reference_features(slide, plan, tiny, indices=picks, tokens=grid)
    np.testing.assert_allclose(features[picks], want[:, :192], atol=1e-4, rtol=1e-4)
    got = tokens.get_orthogonal_selection((picks, slice(None), slice(None), slice(None)))
    np.testing.assert_allclose(got.reshape(3, -1), want[:, 192:], atol=1e-4, rtol=1e-4)
    if grid == 2:  # a 2 x 2 grid is the mean of each 7 x 7 quarter of the model's
        full = reference_features(slide, plan, tiny, indices=picks[:1], tokens="model")[0, 192:]
        full = full.reshape(14, 14, 192)
        np.testing.assert_allclose(
            got[0, 0, 1], full[:7, 7:].mean(axis=(0, 1)), atol=1e-4, rtol=1e-4
        )
    ds = open_embeddings(path, TINY)
    assert ds["tokens"].dims == ("tile", "token_y", "token_x", "token_feature")
    np.testing.assert_array_equal(ds["tokens"][picks[0]].values, got[0])


def test_a_grid_finer_than_the_models_is_refused(store, tiny):
    with pytest.raises(TilestoreError, match=r"makes a 14 x 14 token grid; ask for at most 14"):
        embed([store()], tiny, plan=PLAN, options=replace(FP32, tokens=20))


def test_a_model_without_patch_tokens_is_refused(store, lite):
    with pytest.raises(ModelError, match=r"efficientnet-lite0: no patch tokens to store"):
        embed([store()], lite, plan=PLAN, options=replace(FP32, tokens=2))


def test_a_run_with_other_tokens_does_not_resume_the_group(store, tiny):
    path = store()
    embed([path], tiny, plan=PLAN, options=replace(FP32, tokens=2, max_tiles=8))
    report = embed([path], tiny, plan=PLAN, options=replace(FP32, tokens=4))
    assert report.failures and "tokens" in str(report.failures)
    embed([path], tiny, plan=PLAN, options=replace(FP32, tokens=2))
    group = _group(path)
    assert group.attrs["tilestore"]["complete"] and not np.isnan(group["tokens"][:]).any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compile", [False, True])
def test_tokens_on_the_gpu_equal_the_reference_loop(store, tiny, compile):
    """On CUDA, eager and compiled (each batch a CUDA graph of the wider rows), in bf16."""
    from tilestore.embed.reference import cosine

    path = store()
    options = Options(batch_size=16, precision="bf16", dtype="float32", compile=compile)
    report = embed([path], tiny, plan=PLAN, options=replace(options, tokens=2))
    assert report.device.startswith("cuda") and not report.failures
    group = _group(path)
    slide = open_slide(path)
    plan, _ = load_plan(slide)
    picks = [0, len(plan) // 2, len(plan) - 1]
    want = reference_features(
        slide, plan, tiny, indices=picks, device="cuda", precision="bf16", tokens=2
    )
    tokens = group["tokens"].get_orthogonal_selection(
        (picks, slice(None), slice(None), slice(None))
    )
    assert cosine(group["features"][picks], want[:, :192]).min() > 0.999
    assert cosine(tokens.reshape(3, -1), want[:, 192:]).min() > 0.999
