"""tilestore.masks.holes: holes by one labelling equal scipy's binary_fill_holes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import ndimage

from tilestore.masks.holes import fill_holes, hole_sizes, holes

masks = arrays(bool, st.tuples(st.integers(1, 24), st.integers(1, 24)))


@settings(max_examples=300, deadline=None)
@given(masks)
def test_fill_holes_equals_scipy(mask):
    assert np.array_equal(fill_holes(mask), ndimage.binary_fill_holes(mask))


@settings(max_examples=200, deadline=None)
@given(masks)
def test_hole_sizes_count_each_enclosed_region(mask):
    labels, hole = holes(mask)
    sizes = hole_sizes(labels, hole)
    inside = ndimage.binary_fill_holes(mask) & ~mask
    parts, _ = ndimage.label(inside)
    expected = sorted(np.bincount(parts.ravel())[1:].tolist())
    assert sorted(sizes[hole].tolist()) == expected
    assert not sizes[~hole].any()


def test_a_ring_encloses_its_inside_and_a_cut_ring_does_not():
    ring = np.zeros((9, 9), bool)
    ring[2, 2:7] = ring[6, 2:7] = ring[2:7, 2] = ring[2:7, 6] = True
    assert fill_holes(ring)[3:6, 3:6].all()
    cut = ring.copy()
    cut[4, 6] = False
    assert np.array_equal(fill_holes(cut), cut)
