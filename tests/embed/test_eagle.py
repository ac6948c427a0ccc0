"""EAGLE: CHIEF's attention over CTransPath features of a slide's tiles chooses the 25 it
scores highest, and the slide embedding is the mean of those tiles' Virchow2 class tokens
(KatherLab/EAGLE; STAMP's eagle). The two tile models' features of one plan's tiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tilestore.embed.slides import embed_slides, get_slide_encoder, load_slide_encoder
from tilestore.embed.slides.nets.abmil import Eagle
from tilestore.embeddings import NotEmbedded
from tilestore.embeddings.slides import has_current_vector, read_slide_vector
from tilestore.embeddings.write import write_features
from tilestore.errors import StaleSlideEmbedding
from tilestore.plan import PlanOptions, plan_over_tissue, save_plan
from tilestore.reading.opening import open_slide

PLAN = "eagle"


def _chief_scores(module: Eagle, guide: torch.Tensor) -> torch.Tensor:
    """CHIEF's gated attention written out from its authors' Attn_Net_Gated: the raw score
    of each tile, before the softmax (the module's weights, its own formula)."""
    state = module.state_dict()
    h = torch.relu(guide @ state["attention_net.0.weight"].T + state["attention_net.0.bias"])
    a = torch.tanh(h @ state["attention_net.3.attention_a.0.weight"].T
                   + state["attention_net.3.attention_a.0.bias"])  # fmt: skip
    b = torch.sigmoid(h @ state["attention_net.3.attention_b.0.weight"].T
                      + state["attention_net.3.attention_b.0.bias"])  # fmt: skip
    c = state["attention_net.3.attention_c.weight"], state["attention_net.3.attention_c.bias"]
    return ((a * b) @ c[0].T + c[1])[:, 0]


@pytest.mark.parametrize("tiles", [7, 25, 300])
def test_the_slide_vector_is_the_mean_of_the_tiles_chief_scores_highest(tiles):
    torch.manual_seed(tiles)
    module = Eagle().eval()
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.2)
    features, guide = torch.randn(tiles, 1280), torch.randn(tiles, 768)
    with torch.inference_mode():
        vector = module(features, None, guide)
    scores = _chief_scores(module, guide)
    top = np.argsort(-scores.numpy(), kind="stable")[: min(25, tiles)]
    torch.testing.assert_close(vector, features[top].mean(0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="CTransPath features of the same tiles"):
        module(features, None, guide[:-1])


@pytest.fixture
def both(store):
    """CMU-1-Small-Region on a 2 um/px, 224 px plan stepping 16 px (several hundred tiles),
    with seeded virchow2-cls and chief-ctranspath features of its tiles."""
    path = store()
    slide = open_slide(path)
    options = PlanOptions(mpp=2.0, tile=224, stride=16, min_tissue=0.0, name=PLAN)
    plan = plan_over_tissue(slide, options)
    save_plan(slide, plan)
    rng = np.random.default_rng(7)
    virchow = rng.standard_normal((len(plan), 1280)).astype(np.float32)
    ctranspath = rng.standard_normal((len(plan), 768)).astype(np.float32)
    write_features(path, {"name": "virchow2-cls"}, virchow, plan=PLAN)
    write_features(path, {"name": "chief-ctranspath"}, ctranspath, plan=PLAN)
    return path, virchow, ctranspath


def test_a_store_gets_the_mean_of_its_top_tiles_and_the_guide_it_read_is_recorded(both):
    path, virchow, ctranspath = both
    assert len(virchow) > 100
    report = embed_slides([path], "random:eagle", device="cpu")
    (row,) = report.rows
    assert row.status == "done", row.why
    found = read_slide_vector(path, "virchow2-cls", "random:eagle")
    module = load_slide_encoder("random:eagle", device="cpu").module  # the same seeded draw
    with torch.inference_mode():
        scores = _chief_scores(module, torch.from_numpy(ctranspath))
    top = np.argsort(-scores.numpy(), kind="stable")[:25]
    np.testing.assert_allclose(found["vector"], virchow[top].mean(0), rtol=1e-5, atol=1e-6)
    guide = found["record"]["guide"]
    assert guide["model"] == "chief-ctranspath" and guide["plan"] == PLAN
    assert guide["tiles"] == len(virchow)


def test_a_vector_whose_guide_was_embedded_again_is_stale_and_computed_again(both):
    path, _, ctranspath = both
    embed_slides([path], "random:eagle", device="cpu")
    assert has_current_vector(path, "virchow2-cls", "random:eagle", PLAN)
    write_features(path, {"name": "chief-ctranspath"}, -ctranspath, plan=PLAN, overwrite=True)
    assert not has_current_vector(path, "virchow2-cls", "random:eagle", PLAN)
    with pytest.raises(StaleSlideEmbedding, match=r"chief-ctranspath tile features .* replaced"):
        read_slide_vector(path, "virchow2-cls", "random:eagle", PLAN)
    from tilestore.embeddings.status import embeddings_status

    def state() -> str:
        (group,) = embeddings_status(path, "virchow2-cls").groups
        (vector,) = group.slide_vectors
        return vector.state

    assert state() == "stale"  # status judges it as the reader does
    (row,) = embed_slides([path], "random:eagle", device="cpu").rows
    assert row.status == "done"  # not skipped as done already
    assert has_current_vector(path, "virchow2-cls", "random:eagle", PLAN)
    assert state() == "current"


def _virchow_only(store, into: Path, guide_width: int | None) -> Path:
    """A store on the plan with virchow2-cls features, and chief-ctranspath features of
    `guide_width` (None: none)."""
    path = store(into=into)
    slide = open_slide(path)
    plan = plan_over_tissue(slide, PlanOptions(mpp=2.0, tile=224, min_tissue=0.0, name=PLAN))
    save_plan(slide, plan)
    ones = lambda width: np.ones((len(plan), width), np.float32)  # noqa: E731
    write_features(path, {"name": "virchow2-cls"}, ones(1280), plan=PLAN)
    if guide_width is not None:
        write_features(path, {"name": "chief-ctranspath"}, ones(guide_width), plan=PLAN)
    return path


def test_a_store_without_the_guide_or_with_another_guide_fails_in_one_line(both, store):
    path = both[0]
    missing = _virchow_only(store, Path(path).parent / "missing", None)
    narrow = _virchow_only(store, Path(path).parent / "narrow", 512)
    report = embed_slides([missing, narrow, path], "random:eagle", device="cpu")
    assert [r.status for r in report.rows] == ["failed", "failed", "done"]
    none, wide = report.rows[0].why, report.rows[1].why
    assert "is guided by chief-ctranspath features of the same tiles (plan eagle): " in none
    assert "no embeddings/chief-ctranspath" in none  # the reader's own reason
    assert none.endswith("embed with --model chief-ctranspath --plan eagle --any-scale")
    assert "reads 768-d chief-ctranspath features, these are 512-d" in wide
    assert "\n" not in none + wide
    for failed in (missing, narrow):  # nothing written
        assert not list(Path(failed).glob("embeddings/virchow2-cls/*/slides"))
        with pytest.raises(NotEmbedded):
            read_slide_vector(failed, "virchow2-cls", "random:eagle")


def test_eagle_is_registered_with_its_facts():
    spec = get_slide_encoder("eagle")
    assert (spec.tile_model, spec.guide, spec.mpp, spec.tile, spec.output_dim) == (
        "virchow2-cls", "chief-ctranspath", 2.0, 224, 1280,
    )  # fmt: skip
    assert spec.kwargs["top"] == 25 and spec.weights_file == "CHIEF_pretraining.pth"


def test_a_patients_vector_is_eagle_over_the_tiles_of_all_its_slides(both, store, tmp_path):
    """As STAMP's encode_patients: the patient's slides' tile and guide features joined, one
    slide after another in the table's order, the top 25 of all of them averaged."""
    import pandas as pd

    from tilestore.embed.slides import embed_patients

    first, virchow, ctranspath = both
    second = store(into=tmp_path / "second").rename(tmp_path / "second" / "b.ome.zarr")
    slide = open_slide(second)
    options = PlanOptions(mpp=2.0, tile=224, stride=16, min_tissue=0.0, name=PLAN)
    plan = plan_over_tissue(slide, options)
    save_plan(slide, plan)
    rng = np.random.default_rng(11)
    more_v = rng.standard_normal((len(plan), 1280)).astype(np.float32) + 0.5
    more_c = rng.standard_normal((len(plan), 768)).astype(np.float32)
    write_features(second, {"name": "virchow2-cls"}, more_v, plan=PLAN)
    write_features(second, {"name": "chief-ctranspath"}, more_c, plan=PLAN)
    report = embed_slides([first, second], "random:eagle", device="cpu")
    assert [r.status for r in report.rows] == ["done", "done"]
    name = Path(first).name.removesuffix(".ome.zarr")
    table = tmp_path / "patients.csv"
    table.write_text(f"slide,patient\nb,P1\n{name},P1\n")
    out = tmp_path / "patients.parquet"
    done = embed_patients([first, second], table, out, encoder="random:eagle", device="cpu")
    assert (done.patients, done.slides) == (1, 2)
    found = pd.read_parquet(out)[[f"f{i}" for i in range(1280)]].to_numpy()[0]
    module = load_slide_encoder("random:eagle", device="cpu").module
    features = np.concatenate([more_v, virchow])  # b first: the table's order
    with torch.inference_mode():
        scores = _chief_scores(module, torch.from_numpy(np.concatenate([more_c, ctranspath])))
    top = np.argsort(-scores.numpy(), kind="stable")[:25]
    np.testing.assert_allclose(found, features[top].mean(0), rtol=1e-5, atol=1e-6)
    alone = read_slide_vector(first, "virchow2-cls", "random:eagle")["vector"]
    assert not np.allclose(found, alone)  # not one slide's vector
