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


@settings(max_examples=100, deadline=None)
@given(masks, st.integers(0, 40))
def test_filling_only_small_holes_leaves_the_large_ones_open(mask, max_px):
    filled = fill_holes(mask, max_px=max_px)
    inside = ndimage.binary_fill_holes(mask) & ~mask
    labels, count = ndimage.label(inside)
    sizes = ndimage.sum(inside, labels, range(1, count + 1))
    small = np.isin(labels, 1 + np.flatnonzero(np.asarray(sizes) <= max_px))
    assert np.array_equal(filled, mask | small)


def test_a_lumen_in_real_tissue_stays_glass(tmp_path, cmu_pixels):
    """Glass enclosed by tissue (a lumen, a vessel, a tear) is not tissue: a disk of glass
    300 um across painted into CMU-1's tissue stays out of the mask, while the gaps between
    nuclei are filled."""
    import tifffile

    from tilestore.conversion import convert
    from tilestore.masks import compute_tissue
    from tilestore.reading import open_slide

    pixels = np.array(cmu_pixels)
    yy, xx = np.mgrid[: pixels.shape[0], : pixels.shape[1]]
    cy, cx = 2390, 1240  # level-0 px: the tissue's deepest point, 266 um from any glass
    disk = (yy - cy) ** 2 + (xx - cx) ** 2 <= 300**2  # 300 px radius = 150 um at 0.5 um/px
    pixels[disk] = (242, 242, 240)
    src = tmp_path / "lumen.tif"
    tifffile.imwrite(
        src,
        pixels,
        tile=(256, 256),
        compression="jpeg",
        resolution=(2e4, 2e4),
        resolutionunit="CENTIMETER",
    )
    slide = open_slide(convert(src, tmp_path / "stores").store)
    mask = compute_tissue(slide)
    y, x = round(cy / mask.downsample[0]), round(cx / mask.downsample[1])
    assert not mask.mask[y, x]  # the lumen's centre
    assert mask.mask[y, round((cx + 400) / mask.downsample[1])]  # tissue beside it
    assert compute_tissue(slide, max_hole_um2=1e9).mask[y, x]  # every hole filled: it was in
