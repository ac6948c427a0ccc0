"""`tilestore.learn.losses`: each task's loss against its formula computed by hand (numpy),
class weights, a gradient check, and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tilestore.errors import OptionError
from tilestore.learn.losses import cox, loss_for
from tilestore.learn.task import Task

BINARY = Task("classification", ("MSI",), (("MSI-H", "MSS"),))
TWO = Task("classification", ("MSI", "GRADE"), (("MSI-H", "MSS"), ("G1", "G2", "G3")))
SURVIVAL = Task("survival", ("OS_TIME", "OS_EVENT"))
REGRESSION = Task("regression", ("TMB", "AGE"))


def _cross_entropy(logits: np.ndarray, y: np.ndarray, weights: np.ndarray) -> float:
    """Weighted cross-entropy by hand: sum_i w_yi * -log softmax(z_i)[y_i] / sum_i w_yi."""
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    picked = -log_p[np.arange(len(y)), y]
    return float((weights[y] * picked).sum() / weights[y].sum())


def _cox(risk: np.ndarray, time: np.ndarray, event: np.ndarray) -> float:
    """Breslow's negative partial log-likelihood, one event at a time, averaged."""
    terms = []
    for i in range(len(risk)):
        if event[i]:
            at_risk = [math.exp(risk[j]) for j in range(len(risk)) if time[j] >= time[i]]
            terms.append(risk[i] - math.log(sum(at_risk)))
    return -sum(terms) / len(terms)


def test_cross_entropy_with_class_weights_is_the_weighted_mean():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(9, 2))
    y = np.array([0, 1, 1, 0, 1, 1, 1, 0, 1])
    loss = loss_for(BINARY, class_weights=[(3.0, 0.5)])
    got = loss(torch.tensor(logits), torch.tensor(y[:, None], dtype=torch.float64))
    assert float(got) == pytest.approx(_cross_entropy(logits, y, np.array([3.0, 0.5])), abs=1e-9)
    plain = loss_for(BINARY)(torch.tensor(logits), torch.tensor(y[:, None], dtype=torch.float64))
    assert float(plain) == pytest.approx(_cross_entropy(logits, y, np.ones(2)), abs=1e-9)
    assert float(plain) != pytest.approx(float(got), abs=1e-3)


def test_several_targets_average_their_heads_cross_entropies():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(6, 5))  # MSI: columns 0-1, GRADE: 2-4
    y = np.array([[0, 2], [1, 0], [1, 1], [0, 0], [1, 2], [0, 1]])
    got = loss_for(TWO)(torch.tensor(logits), torch.tensor(y, dtype=torch.float64))
    msi = _cross_entropy(logits[:, :2], y[:, 0], np.ones(2))
    grade = _cross_entropy(logits[:, 2:], y[:, 1], np.ones(3))
    assert float(got) == pytest.approx((msi + grade) / 2, abs=1e-9)


def test_mse_over_patients_and_targets():
    rng = np.random.default_rng(2)
    pred, y = rng.normal(size=(7, 2)), rng.normal(size=(7, 2))
    got = loss_for(REGRESSION)(torch.tensor(pred), torch.tensor(y))
    assert float(got) == pytest.approx(float(((pred - y) ** 2).mean()), abs=1e-12)


def test_cox_is_breslows_partial_likelihood_with_ties():
    rng = np.random.default_rng(3)
    risk = rng.normal(size=12)
    time = np.array([5, 3, 3, 8, 1, 5, 5, 9, 2, 3, 7, 7], dtype=float)  # tied times
    event = np.array([1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 0, 1], dtype=float)
    y = torch.tensor(np.stack([time, event], axis=1))
    got = loss_for(SURVIVAL)(torch.tensor(risk[:, None]), y)
    assert float(got) == pytest.approx(_cox(risk, time, event), abs=1e-9)


def test_cox_does_not_see_a_shift_of_every_risk():
    rng = np.random.default_rng(4)
    risk = torch.tensor(rng.normal(size=(8, 1)))
    y = torch.tensor([[3, 1], [1, 1], [4, 0], [2, 1], [6, 1], [5, 0], [2, 0], [7, 1.0]])
    torch.testing.assert_close(cox(risk + 17.0, y), cox(risk, y))


def test_cox_without_an_event_is_zero_and_still_backpropagates():
    risk = torch.randn(4, 1, requires_grad=True)
    loss = cox(risk, torch.tensor([[1.0, 0], [2, 0], [3, 0], [4, 0]]))
    loss.backward()
    assert float(loss.detach()) == 0 and torch.equal(risk.grad, torch.zeros(4, 1))


def test_cox_gradients_match_finite_differences():
    risk = torch.randn(6, 1, dtype=torch.double, requires_grad=True)
    y = torch.tensor([[2, 1], [2, 1], [1, 0], [5, 1], [3, 0], [4, 1.0]], dtype=torch.double)
    assert torch.autograd.gradcheck(lambda r: cox(r, y), (risk,))


def test_weighted_cross_entropy_gradients_match_finite_differences():
    logits = torch.randn(5, 5, dtype=torch.double, requires_grad=True)
    y = torch.tensor([[0, 2], [1, 0], [1, 1], [0, 0], [1, 2.0]], dtype=torch.double)
    loss = loss_for(TWO, class_weights=[(1.0, 2.0), (0.5, 1.0, 3.0)])
    assert torch.autograd.gradcheck(lambda z: loss(z, y), (logits,))


@pytest.mark.parametrize(
    ("task", "weights", "said"),
    [
        (BINARY, [(1.0, 2.0, 3.0)], r"class weights \[3\] per target for classes \[2\]"),
        (TWO, [(1.0, 2.0)], r"class weights \[2\] per target for classes \[2, 3\]"),
        (BINARY, [(1.0, -2.0)], "each must be a number >= 0"),
        (BINARY, [(1.0, float("nan"))], "each must be a number >= 0"),
        (SURVIVAL, [(1.0, 1.0)], "class weights for a survival task"),
    ],
)
def test_wrong_class_weights_are_refused_in_one_line(task, weights, said):
    with pytest.raises(OptionError, match=said):
        loss_for(task, class_weights=weights)


def test_half_precision_logits_are_taken_in_fp32():
    logits = torch.randn(6, 1, dtype=torch.bfloat16)
    y = torch.tensor([[2, 1], [2, 1], [1, 0], [5, 1], [3, 0], [4, 1.0]])
    got = loss_for(SURVIVAL)(logits, y)
    assert got.dtype == torch.float32
    assert float(got) == pytest.approx(float(cox(logits.float(), y)), abs=1e-6)
