"""Cohorts of slide vectors (a slide encoder's one vector per slide) are learnt from those
vectors, never from the tile features beside them; a model that cannot learn a cohort is
refused before anything is written; CLAM-SB trains its instance classifiers."""

from __future__ import annotations

import numpy as np
import pytest

from tilestore.errors import OptionError, RunError
from tilestore.learn import LearnOptions, Task, build_cohort, crossval, make_splits, predict
from tilestore.learn.bags import load_bags

from .cohorts import copies

MODEL = "efficientnet-lite0"
WIDTH = 7  # the toy encoder's vectors: another width than the tiles' 1,280
OPTIONS = LearnOptions(
    model="linear", device="cpu", epochs=60, patience=60, lr=0.05, batch_size=4, threads=1,
    dropout=0.0, weight_decay=0.0,
)  # fmt: skip


def _vectors(embedded_cohort, folder, n=8):
    """`n` copies of the embedded store (labels neg, pos, ...), each with a toy encoder's
    vector whose first value says the label (the tiles, all alike, cannot)."""
    from tilestore.embeddings.slides import read_tile_features, write_slide_vector

    made, table = copies(embedded_cohort, folder, n)
    rng = np.random.default_rng(0)
    for i, store in enumerate(made):
        vector = rng.standard_normal(WIDTH).astype(np.float32)
        vector[0] = 3.0 if i % 2 else -3.0
        tiles = read_tile_features(store, MODEL)
        write_slide_vector(tiles, "toy", vector, {"encoder": "toy", "dim": WIDTH})
    return made, table


@pytest.fixture(scope="module")
def vector_cohort(embedded_cohort, tmp_path_factory):
    made, table = _vectors(embedded_cohort, tmp_path_factory.mktemp("vectors"))
    cohort = build_cohort(table, made, MODEL, targets="status", slide_encoder="toy")
    return made, cohort


def test_a_vector_cohort_trains_on_the_vectors_not_the_tiles(vector_cohort, tmp_path):
    made, cohort = vector_cohort
    bags = load_bags(cohort)
    assert bags.dim == WIDTH and [bags.tiles(p) for p in range(bags.patients)] == [1] * 8
    assert float(bags.slide(1)[0, 0]) == 3.0 and float(bags.slide(0)[0, 0]) == -3.0
    result = crossval(cohort, make_splits(cohort, 2, seed=0), OPTIONS, tmp_path / "run")
    assert result.metrics["auroc"].value == 1.0  # the vectors say it; the tiles cannot
    config = __import__("json").loads((tmp_path / "run" / "config.json").read_text())
    assert config["features"]["slide_encoder"] == "toy" and config["dim"] == WIDTH
    table = predict(tmp_path / "run", made, device="cpu")
    assert list(table["predicted"]) == ["neg", "pos"] * 4


def test_a_vector_run_refuses_stores_without_the_vector_and_explains_no_tiles(
    vector_cohort, embedded_cohort, tmp_path
):
    from tilestore.errors import NotEmbedded
    from tilestore.learn import explain

    made, cohort = vector_cohort
    crossval(cohort, make_splits(cohort, 2, seed=0), OPTIONS, tmp_path / "run")
    with pytest.raises(NotEmbedded, match="toy"):  # tile features alone are not the run's
        predict(tmp_path / "run", [embedded_cohort[0]], device="cpu")
    with pytest.raises(RunError, match="slide vectors, one per slide"):
        explain(tmp_path / "run", made[:1], device="cpu")


@pytest.mark.parametrize(
    ("model", "vectors", "kind", "said"),
    [
        ("abmil", True, "classification", "reads bags of tile features"),
        ("mean", True, "classification", "reads bags of tile features"),
        ("linear", False, "classification", "reads one vector per slide"),
        ("clam-sb", False, "regression", "one classification target"),
    ],
)
def test_a_model_that_cannot_learn_the_cohort_is_refused_before_anything_is_written(
    vector_cohort, embedded_cohort, tmp_path, model, vectors, kind, said
):
    _, vector = vector_cohort
    if vectors:
        cohort = vector
    else:
        tiles_made, table = copies(embedded_cohort, tmp_path / "tiles", 6)
        table_frame = __import__("pandas").read_csv(table)
        table_frame["score"] = np.arange(6, dtype=float)
        cohort = build_cohort(
            table_frame, tiles_made, MODEL, targets="status" if kind != "regression" else "score",
            kind=kind,
        )  # fmt: skip
    options = LearnOptions(**{**OPTIONS.to_json(), "model": model})
    with pytest.raises(OptionError, match=said):
        crossval(cohort, make_splits(cohort, 2, seed=0), options, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_clam_trains_on_the_bag_and_the_instance_loss_from_one_forward_pass():
    import torch

    from tilestore.learn.bags import Bags
    from tilestore.learn.cohort import Cohort
    from tilestore.learn.losses import loss_for
    from tilestore.learn.models import make_model
    from tilestore.learn.training import fit

    torch.manual_seed(0)
    model = make_model("clam-sb", 8, 2, hidden=16, k_sample=3)
    x, mask = torch.randn(2, 10, 8), torch.ones(2, 10, dtype=torch.bool)
    y = torch.tensor([[1.0], [0.0]])
    task = Task("classification", ("label",), (("0", "1"),))
    loss = loss_for(task)
    bag = loss(model(x, mask).logits, y)
    instance = model.instance_loss(x, y[:, 0].long(), mask)
    both = model.training_loss(x, mask, y, loss)
    assert torch.allclose(both, 0.7 * bag + 0.3 * instance)

    rng = np.random.default_rng(0)
    feats = [rng.standard_normal((12, 8)).astype(np.float32) for _ in range(12)]
    bags = Bags.from_arrays(feats, [[i] for i in range(12)])
    labels = (np.arange(12) % 2).astype(float)[:, None]
    cohort = Cohort.from_labels(task, [f"P{i}" for i in range(12)], labels)
    options = LearnOptions(model="clam-sb", device="cpu", epochs=2, hidden=16, threads=1)
    torch.manual_seed(options.seed)
    start = make_model("clam-sb", 8, 2, **options.hparams()).state_dict()
    fitted = fit(cohort.task, bags, labels, range(10), [], options)
    moved = {k: float((v - start[k]).abs().max()) for k, v in fitted.model.state_dict().items()}
    assert moved["instance.1.weight"] > 0 and moved["instance.0.weight"] > 0
