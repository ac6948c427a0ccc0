"""crossval and train on real tile features: the planted-region check (right answers on
real tissue, the planted tiles on top of the attention, a shuffled-label control at chance),
bitwise repeatable fits, resume after a kill, a run folder that exists refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tilestore.errors import RunError
from tilestore.learn.options import LearnOptions
from tilestore.learn.run import FINISHED, crossval, load_models
from tilestore.learn.splits import make_splits

from .planted import planted_cohort, top_k_share

OPTIONS = LearnOptions(
    model="abmil", device="cpu", epochs=20, patience=6, lr=1e-3, hidden=64, threads=1
)


@pytest.fixture(scope="session")
def tile_features(embedded_cohort):
    """The real stores' tile features (efficientnet-lite0, CPU): H&E background, IHC region."""
    import tilestore

    cmu, ihc = embedded_cohort
    background = tilestore.open_embeddings(cmu, "efficientnet-lite0").features.values
    region = tilestore.open_embeddings(ihc, "efficientnet-lite0").features.values
    return np.asarray(background, np.float32), np.asarray(region, np.float32)


@pytest.fixture(scope="session")
def planted_run(tile_features, tmp_path_factory):
    made = planted_cohort(*tile_features)
    out = tmp_path_factory.mktemp("runs") / "planted"
    result = crossval(
        made.cohort, make_splits(made.cohort, 5, seed=0), OPTIONS, out, bags=made.bags
    )
    return made, result


def test_planted_region_found_on_held_out_slides(planted_run):
    from tilestore.learn.explanation import tile_scores

    made, result = planted_run
    auroc = result.metrics["auroc"]
    print(f"planted: held-out AUROC {auroc.value:.3f} [{auroc.low:.3f}, {auroc.high:.3f}]")
    assert auroc.value >= 0.95
    # every patient predicted once, by the fold that held it out
    assert sorted(result.predictions["patient"]) == sorted(made.cohort.patients)
    # the heatmap: each held-out slide scored by its own fold's model
    attention, planted = [], []
    folds = result.predictions.set_index("patient")["fold"]
    models = {}
    for i, patient in enumerate(made.cohort.patients):
        k = int(folds[patient])
        models.setdefault(k, load_models(result.run_dir, "cpu", fold=k))
        scores, has_attention = tile_scores(models[k], made.slides[i], "cpu")
        assert has_attention
        attention.append(scores[:, 0])
        planted.append(made.planted[i])
    share = top_k_share(attention, planted)
    print(f"planted: share of the top-k attention tiles that are planted: {share:.3f}")
    assert share >= 0.7  # 0.80 here: some IHC tiles drawn are background, like H&E ones


def test_shuffled_labels_are_at_chance(tile_features, tmp_path):
    made = planted_cohort(*tile_features, shuffle=True)
    result = crossval(
        made.cohort,
        make_splits(made.cohort, 5, seed=0),
        OPTIONS,
        tmp_path / "control",
        bags=made.bags,
    )
    auroc = result.metrics["auroc"]
    print(f"control: AUROC {auroc.value:.3f} [{auroc.low:.3f}, {auroc.high:.3f}]")
    assert auroc.low <= 0.5 <= auroc.high


def test_a_fit_is_bitwise_repeatable(tile_features):
    from tilestore.learn.training import fit

    made = planted_cohort(*tile_features, slides=12)
    options = LearnOptions(**{**OPTIONS.to_json(), "epochs": 3})
    runs = [
        fit(made.cohort.task, made.bags, made.cohort.labels, range(8), range(8, 12), options)
        for _ in range(2)
    ]
    a, b = (r.model.state_dict() for r in runs)
    assert a.keys() == b.keys()
    assert all(a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a)
    other = fit(
        made.cohort.task,
        made.bags,
        made.cohort.labels,
        range(8),
        range(8, 12),
        LearnOptions(**{**options.to_json(), "seed": 1}),
    )
    c = other.model.state_dict()
    assert any(a[k].numpy().tobytes() != c[k].numpy().tobytes() for k in a)


def test_no_patient_in_two_parts_of_a_fold(planted_run):
    made, result = planted_run
    splits = json.loads((result.run_dir / "splits.json").read_text())
    tested = []
    for fold in splits["folds"]:
        parts = [set(fold[p]) for p in ("train", "valid", "test")]
        assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
        tested += fold["test"]
    assert sorted(tested) == sorted(made.cohort.patients)


def test_a_fold_with_a_patient_twice_is_refused_before_training(tile_features, tmp_path):
    from tilestore.learn.splits import Fold, Splits

    made = planted_cohort(*tile_features, slides=8)
    p = made.cohort.patients
    leaky = Splits((Fold(p[:5], p[5:6], (p[0], *p[6:])),), 0, ())
    with pytest.raises(RunError, match="two of train/valid/test"):
        crossval(made.cohort, leaky, OPTIONS, tmp_path / "run", bags=made.bags)
    assert not (tmp_path / "run").exists()


def test_a_killed_run_resumes_at_its_unfinished_fold(planted_run, tmp_path):
    made, result = planted_run
    copy = tmp_path / "run"
    shutil.copytree(result.run_dir, copy)
    # as a kill in fold 3 leaves it: no finished marker, fold 3 half made, folds 3-4 absent
    (copy / FINISHED).unlink()
    weights = {k: (copy / f"fold_{k}" / "model.safetensors").read_bytes() for k in range(5)}
    shutil.rmtree(copy / "fold_3")
    shutil.rmtree(copy / "fold_4")
    (copy / ".fold_3").mkdir()
    (copy / ".fold_3" / "model.safetensors").write_bytes(b"half")
    lines = []
    again = crossval(
        made.cohort,
        make_splits(made.cohort, 5, seed=0),
        OPTIONS,
        copy,
        bags=made.bags,
        resume=True,
        progress=lines.append,
    )
    assert sum("finished before, read back" in line for line in lines) == 3
    assert (copy / FINISHED).exists() and not (copy / ".fold_3").exists()
    for k in range(5):  # folds trained again give the same bytes (the run is repeatable)
        assert (copy / f"fold_{k}" / "model.safetensors").read_bytes() == weights[k]
    assert again.metrics["auroc"].value == result.metrics["auroc"].value


def test_a_run_folder_that_exists_is_refused(planted_run, tmp_path):
    made, result = planted_run
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    for target in (result.run_dir, tmp_path / "taken"):
        with pytest.raises(RunError, match="exists"):
            crossval(made.cohort, make_splits(made.cohort, 5), OPTIONS, target, bags=made.bags)
    with pytest.raises(RunError, match="not a run folder"):
        crossval(
            made.cohort,
            make_splits(made.cohort, 5),
            OPTIONS,
            tmp_path / "taken",
            bags=made.bags,
            overwrite=True,
        )
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("valid", [float("nan"), 0, -0.1, 2.0, "x"])
def test_trains_validation_share_is_refused_at_the_door(valid, tmp_path):
    from tilestore.errors import OptionError
    from tilestore.learn import Task, train
    from tilestore.learn.cohort import Cohort

    cohort = Cohort.from_labels(
        Task("classification", ("y",), (("0", "1"),)), [f"P{i}" for i in range(6)], [0, 1] * 3
    )
    with pytest.raises(OptionError, match="valid="):
        train(cohort, LearnOptions(device="cpu"), tmp_path / "run", valid=valid)
    assert not (tmp_path / "run").exists()
