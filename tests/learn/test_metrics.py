"""Each metric equals its reference on the same predictions (scikit-learn's, scipy's
pearsonr, lifelines' concordance_index), ties and several classes included; evaluate names
them per target; the bootstrap intervals hold the value and repeat with their seed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lifelines.utils import concordance_index
from scipy.stats import pearsonr
from sklearn.metrics import (
    average_precision_score,
    balanced_accuracy_score,
    f1_score,
    r2_score,
    roc_auc_score,
)

from tilestore.errors import LabelError
from tilestore.learn import Task, c_index, evaluate
from tilestore.learn.metrics import probabilities

EXACT = 1e-12
BINARY = Task("classification", ("MSI",), (("MSI-H", "MSS"),))
THREE = Task("classification", ("grade",), (("1", "2", "3"),))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(4, 80), rounding=st.sampled_from([0, 1, 3]))
def test_binary_metrics_equal_scikit_learns(seed, n, rounding):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    y[:2] = [0, 1]  # both classes
    logits = np.round(rng.normal(size=(n, 2)) + np.c_[-y, y], rounding)  # ties when rounded
    got = evaluate(BINARY, y[:, None], logits, n_boot=0)
    p = probabilities(logits)[:, 1]
    chosen = logits.argmax(axis=1)
    assert abs(got["auroc"].value - roc_auc_score(y, p)) < EXACT
    assert abs(got["auprc"].value - average_precision_score(y, p)) < EXACT
    assert abs(got["balanced_accuracy"].value - balanced_accuracy_score(y, chosen)) < EXACT
    assert abs(got["f1"].value - f1_score(y, chosen, zero_division=0)) < EXACT
    # probabilities given as they are rank the same
    given_p = evaluate(BINARY, y[:, None], probabilities(logits), n_boot=0)
    assert abs(given_p["auroc"].value - got["auroc"].value) < EXACT


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(9, 80))
def test_multiclass_metrics_equal_scikit_learns_one_vs_rest_macro(seed, n):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    y[:3] = [0, 1, 2]
    logits = np.round(rng.normal(size=(n, 3)), 1)
    logits[np.arange(n), y] += 0.8
    got = evaluate(THREE, y[:, None], logits, n_boot=0)
    p = probabilities(logits)
    chosen = p.argmax(axis=1)
    assert abs(got["auroc"].value - roc_auc_score(y, p, multi_class="ovr")) < EXACT
    onehot = np.eye(3)[y]
    assert abs(got["auprc"].value - average_precision_score(onehot, p, average="macro")) < EXACT
    assert abs(got["balanced_accuracy"].value - balanced_accuracy_score(y, chosen)) < EXACT
    assert abs(got["f1"].value - f1_score(y, chosen, average="macro", zero_division=0)) < EXACT


def test_several_targets_are_named_per_target():
    rng = np.random.default_rng(0)
    task = Task("classification", ("MSI", "grade"), (("H", "S"), ("1", "2", "3")))
    y = np.c_[rng.integers(0, 2, 50), rng.integers(0, 3, 50)]
    logits = rng.normal(size=(50, 5))
    got = evaluate(task, y, logits, n_boot=10)
    assert sorted(got) == sorted(
        f"{t}:{m}" for t in ("MSI", "grade") for m in ("auroc", "auprc", "balanced_accuracy", "f1")
    )
    assert abs(got["grade:auroc"].value - roc_auc_score(y[:, 1], probabilities(logits[:, 2:]),
                                                         multi_class="ovr")) < EXACT  # fmt: skip
    assert abs(got["MSI:auroc"].value - roc_auc_score(y[:, 0], logits[:, 1] - logits[:, 0])) < EXACT


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(3, 80))
def test_regression_metrics_equal_scipy_and_scikit_learn(seed, n):
    rng = np.random.default_rng(seed)
    y = rng.normal(size=(n, 2))
    predicted = y + rng.normal(size=(n, 2))
    got = evaluate(Task("regression", ("a", "b")), y, predicted, n_boot=0)
    for j, t in enumerate("ab"):
        assert abs(got[f"{t}:pearson"].value - pearsonr(y[:, j], predicted[:, j])[0]) < EXACT
        assert abs(got[f"{t}:r2"].value - r2_score(y[:, j], predicted[:, j])) < EXACT


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 80), rounding=st.sampled_from([0, 1]))
def test_c_index_equals_lifelines_with_ties_in_time_and_risk(seed, n, rounding):
    rng = np.random.default_rng(seed)
    time = np.round(rng.exponential(3, n), rounding) + 1  # ties in time when rounded
    event = rng.integers(0, 2, n)
    event[0] = 1
    risk = np.round(rng.normal(size=n), rounding)  # ties in risk
    try:
        expected = concordance_index(time, -risk, event)  # lifelines: higher = longer life
    except ZeroDivisionError:  # no admissible pair
        assert np.isnan(c_index(time, event, risk))
        return
    assert abs(c_index(time, event, risk) - expected) < EXACT
    got = evaluate(Task("survival", ("OS", "DEAD")), np.c_[time, event], risk[:, None], n_boot=0)
    assert abs(got["c_index"].value - expected) < EXACT


def _draw(task: Task, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels and predictions with some skill, of a task."""
    if task.kind == "classification":
        y = rng.integers(0, task.outputs, (n, 1))
        return y, rng.normal(size=(n, task.outputs)) + 1.5 * np.eye(task.outputs)[y[:, 0]]
    if task.kind == "regression":
        y = rng.normal(size=(n, 1))
        return y, y + rng.normal(size=(n, 1))
    time = rng.exponential(size=n) + 0.1
    return np.c_[time, rng.integers(0, 2, n)], -time[:, None] + rng.normal(size=(n, 1))


@pytest.mark.parametrize(
    "task", [BINARY, THREE, Task("regression", ("y",)), Task("survival", ("t", "e"))]
)
def test_bootstrap_intervals_hold_the_value_and_repeat_with_their_seed(task):
    y, predicted = _draw(task, np.random.default_rng(5), 120)
    first = evaluate(task, y, predicted, n_boot=300, seed=11)
    assert first == evaluate(task, y, predicted, n_boot=300, seed=11)
    other = evaluate(task, y, predicted, n_boot=300, seed=12)
    for name, m in first.items():
        assert m.low <= m.value <= m.high, name
        assert m.high - m.low > 0.01, name  # 120 patients: a real interval
        assert (other[name].low, other[name].high) != (m.low, m.high)
        assert other[name].value == m.value


def test_predictions_of_the_wrong_shape_or_not_finite_are_refused():
    y = np.array([[0], [1], [1]])
    with pytest.raises(LabelError, match=r"predictions of shape \(3, 3\), not \(3, 2\)"):
        evaluate(BINARY, y, np.zeros((3, 3)))
    with pytest.raises(LabelError, match=r"labels of shape \(3,\), not \(patients, 1\)"):
        evaluate(BINARY, y[:, 0], np.zeros((3, 2)))
    with pytest.raises(LabelError, match="NaN or infinite"):
        evaluate(BINARY, y, np.array([[0, 1], [np.nan, 0], [0, 1]]))


def test_a_metric_undefined_on_one_class_is_nan():
    got = evaluate(BINARY, np.zeros((5, 1)), np.zeros((5, 2)), n_boot=20)
    assert np.isnan(got["auroc"].value) and np.isnan(got["auroc"].low)


def test_the_c_index_draws_counted_at_once_equal_them_one_by_one():
    rng = np.random.default_rng(9)
    n = 80
    time = np.round(rng.exponential(3, n), 0) + 1  # ties
    event = rng.integers(0, 2, n)
    risk = np.round(rng.normal(size=n), 1)
    task = Task("survival", ("t", "e"))
    got = evaluate(task, np.c_[time, event], risk[:, None], n_boot=200, seed=4)["c_index"]
    draws = np.random.default_rng(4).integers(0, n, size=(200, n))
    one_by_one = np.array([c_index(time[d], event[d], risk[d]) for d in draws])
    low, high = np.percentile(one_by_one[np.isfinite(one_by_one)], [2.5, 97.5])
    assert (got.low, got.high) == (low, high)


def test_a_task_says_its_outputs_and_refuses_what_cannot_be():
    task = Task("classification", ("a", "b"), (("x", "y"), ("1", "2", "3")))
    assert task.outputs == 5 and task.heads() == [slice(0, 2), slice(2, 5)]
    assert Task.from_json(task.to_json()) == task
    assert Task("regression", ("a", "b")).outputs == 2 and Task("survival", ("t", "e")).outputs == 1
    from tilestore.errors import OptionError

    for kind, targets, classes, match in [
        ("ranking", ("a",), (), "task kind 'ranking'"),
        ("classification", ("a",), (), "names the classes of each target"),
        ("survival", ("t",), (), r"are \(time column, event column\)"),
        ("regression", ("a",), (("x",),), "a regression task has no classes"),
    ]:
        with pytest.raises(OptionError, match=match):
            Task(kind, targets, classes)
