"""tilestore.qc.colour: the fast filters equal (or stay within a stated bound of) the
plain definitions they replace."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tests.conftest import CMU, SLIDES, real
from tilestore.qc.colour import Pixels, decimation, dilate, gaussian, hue_chroma, lab


def _plain_gaussian(image: torch.Tensor, sigma: float) -> torch.Tensor:
    """The textbook separable Gaussian: conv2d with reflected edges, float64."""
    radius = max(1, math.ceil(3 * sigma))
    taps = torch.tensor([math.exp(-0.5 * (i / sigma) ** 2) for i in range(-radius, radius + 1)])
    taps = (taps / taps.sum()).double()
    x = image.double()[None, None]
    x = F.conv2d(F.pad(x, [radius, radius, 0, 0], mode="reflect"), taps.view(1, 1, 1, -1))
    x = F.conv2d(F.pad(x, [0, 0, radius, radius], mode="reflect"), taps.view(1, 1, -1, 1))
    return x[0, 0].float()


def _plain_dilate(mask: torch.Tensor, radius: int) -> torch.Tensor:
    """Dilation by a square as the OR of every shift in it."""
    h, w = mask.shape
    padded = F.pad(mask[None].float(), [radius] * 4)[0] > 0
    out = torch.zeros_like(mask)
    for dy in range(2 * radius + 1):
        for dx in range(2 * radius + 1):
            out |= padded[dy : dy + h, dx : dx + w]
    return out


@pytest.fixture(scope="module")
def density() -> torch.Tensor:
    """Total optical density of real H&E (CMU-1-Small-Region) at full resolution."""
    import tifffile

    rgb = tifffile.imread(real(SLIDES / CMU))[:1024, :1024]
    return Pixels(torch.from_numpy(np.ascontiguousarray(rgb.transpose(2, 0, 1))), 0.5).od_sum


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 3.87])
def test_exact_gaussian_equals_the_textbook_one(density, sigma):
    got = gaussian(density, sigma, exact=True)
    assert torch.allclose(got, _plain_gaussian(density, sigma), atol=1e-5)


@pytest.mark.parametrize("sigma", [4.0, 6.0, 8.0, 12.0, 24.0])
def test_coarse_grid_gaussian_is_within_one_percent_of_the_range(density, sigma):
    assert decimation(sigma) > 1
    exact = _plain_gaussian(density, sigma)
    error = (gaussian(density, sigma) - exact).abs()
    margin = math.ceil(3 * sigma) + 8  # edges are a block's halo, cut off by its caller
    span = float(exact.max() - exact.min())
    assert float(error[margin:-margin, margin:-margin].max()) < 0.01 * span
    assert float(error.mean()) < 0.001 * span


def test_then_runs_on_the_coarse_grid(density):
    sizes = []
    gaussian(density, 12.0, then=lambda x: sizes.append(x.shape) or x)
    assert sizes == [(1, 256, 256)]  # 1024 px / 4
    gaussian(density, 1.0, then=lambda x: sizes.append(x.shape) or x)
    assert sizes[-1] == (1, 1024, 1024)


@settings(max_examples=120, deadline=None)
@given(arrays(bool, st.tuples(st.integers(1, 20), st.integers(1, 20))), st.integers(1, 9))
def test_dilation_by_doubling_spans_equals_every_shift(mask, radius):
    mask = torch.from_numpy(mask)
    assert torch.equal(dilate(mask, radius), _plain_dilate(mask, radius))


def test_chroma_where_equals_chroma_of_every_pixel_where_asked():
    rgb = torch.randint(0, 256, (3, 40, 50), dtype=torch.uint8)
    px = Pixels(rgb, 4.0)
    where = px.gray < 0.2
    assert where.any() and not where.all()
    full = hue_chroma(lab(px.linear))[1]
    got = px.chroma_where(where)
    assert torch.allclose(got[where], full[where], atol=1e-4)
    assert not got[~where].any()
