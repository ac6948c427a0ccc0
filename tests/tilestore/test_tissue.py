"""Tissue masks on real slides: brightfield, fluorescence, nearly empty, empty."""

from __future__ import annotations

import re
import shutil
import warnings
from unittest.mock import patch

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from ome_zarr_models.v05 import Image as OmeImage
from ome_zarr_models.v05 import ImageLabel
from PIL import Image
from scipy import ndimage

from tests.conftest import CMU, IHC, KIDNEY, NDPI
from tilestore.conversion.converter import convert
from tilestore.errors import TilestoreError, TilestoreWarning
from tilestore.masks import tissue
from tilestore.masks.tissue import compute_tissue, read_tissue, write_tissue
from tilestore.reading.opening import open_slide


@pytest.fixture
def writable(tmp_path, stores):
    """A private copy of a session store, for tests that write into it."""

    def copy(name):
        target = tmp_path / f"{name}.ome.zarr"
        shutil.copytree(stores(name), target)
        return open_slide(target)

    return copy


def _saturation(pixels):
    p = pixels.astype(float)
    hi, lo = p.max(axis=2), p.min(axis=2)
    return np.where(hi > 0, (hi - lo) / np.maximum(hi, 1), 0)


def test_he_mask_sits_on_the_tissue(stores):
    slide = open_slide(stores(CMU))
    tissue = compute_tissue(slide)
    assert tissue.method == "otsu" and tissue.polarity == "bright background"
    assert tissue.source_level == 2  # 2 um/px: the coarsest level finer than 8 um/px
    assert tissue.mpp == 8.0 and tissue.mask.shape == (185, 138)
    assert 0.25 < tissue.fraction < 0.45
    # against the pixels: masked areas are coloured, unmasked areas are mostly glass
    lv = slide.levels[2]
    pixels = slide.read_region(0, 0, lv.width, lv.height, level=2)
    small = np.asarray(Image.fromarray(pixels).resize(tissue.mask.shape[::-1]))
    sat = _saturation(small)
    assert np.median(sat[tissue.mask]) > 0.2
    assert np.median(sat[~tissue.mask]) < 0.05


def test_fluorescence_detected_from_the_store_and_from_pixels(stores, tmp_path, slide_path):
    declared = compute_tissue(open_slide(stores(NDPI)))
    assert declared.polarity == "dark background"
    assert any("fluorescence declared" in n for n in declared.notes)
    assert 0.6 < declared.fraction < 0.95
    # The same pixels without the vendor's fluorescence tag: auto must find the dark background.
    import tifffile

    plain = tmp_path / "dapi.tif"
    tifffile.imwrite(
        plain,
        tifffile.imread(slide_path(NDPI), level=2),
        photometric="rgb",
        resolution=(1e4 / (4 * 0.22818), 1e4 / (4 * 0.22818)),
        resolutionunit=3,
    )
    store = convert(plain, tmp_path / "out", codec="zstd").store
    detected = compute_tissue(open_slide(store))
    assert detected.polarity == "dark background"
    assert any("dark (fluorescence-like) background" in n for n in detected.notes)
    assert abs(detected.fraction - declared.fraction) < 0.1


def test_nearly_empty_slide_finds_its_fragment(stores):
    tissue = compute_tissue(open_slide(stores(KIDNEY)))
    assert any("pixel size unknown" in n for n in tissue.notes)
    assert tissue.mask.shape == (901, 1493)  # small slide: mask at full size
    assert 0 < tissue.fraction < 0.01
    # independently: the fragment is where the pixels are clearly darker than the glass
    slide = open_slide(stores(KIDNEY))
    pixels = slide.read_region(0, 0, 1493, 901, level=0).astype(int).mean(axis=2)
    dark = pixels < 200
    assert dark.sum() > 500
    assert tissue.mask[dark].mean() > 0.9  # the mask covers the fragment
    assert tissue.mask.sum() < 4 * dark.sum()  # and not much besides


def test_a_slide_coarser_than_the_mask_gets_a_mask_of_its_own_pixels(stores):
    """The CAMELYON DICOM is 1152x700 px at 28.97 um/px: its mask at 8 um/px was 4172x2535,
    pixels invented by upsampling and a mask past the image's extent at its downsample."""
    slide = open_slide(stores("camelyon_lymphnode_jpeg.dcm"))
    found = compute_tissue(slide)
    assert found.mask.shape == slide.shape[1:] == (700, 1152)
    assert found.downsample == (1.0, 1.0) and found.mpp == max(slide.mpp)
    assert 0.05 < found.fraction < 0.6


def test_all_tissue_crop_is_not_split_in_two(stores):
    tissue = compute_tissue(open_slide(stores(IHC)))
    assert any("no glass found" in n for n in tissue.notes)
    assert tissue.fraction > 0.6


def test_blank_slide_is_a_clear_message_not_a_crash(tmp_path):
    blank = tmp_path / "blank.png"
    noise = np.random.default_rng(0).integers(243, 250, (600, 800, 3)).astype(np.uint8)
    Image.fromarray(noise).save(blank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TilestoreWarning)
        store = convert(blank, tmp_path / "out").store
    tissue = compute_tissue(open_slide(store))
    assert not tissue.mask.any() and "no tissue found" in tissue.notes


def test_contrast_rule(stores):
    slide = open_slide(stores(CMU))
    tissue = compute_tissue(slide, "contrast")
    otsu = compute_tissue(slide)
    assert tissue.method == "contrast" and tissue.params["max_min"] == 135
    # the rule and Otsu agree on most of the slide
    assert (tissue.mask == otsu.mask).mean() > 0.85
    strict = compute_tissue(slide, "contrast", max_median=150)
    assert strict.mask.sum() < tissue.mask.sum()


def test_contrast_needs_mpp_and_methods_are_checked(stores):
    with pytest.raises(TilestoreError, match="needs a known pixel size"):
        compute_tissue(open_slide(stores(KIDNEY)), "contrast")
    with pytest.raises(TilestoreError, match="method='magic': must be one of 'auto', 'otsu'"):
        compute_tissue(open_slide(stores(CMU)), "magic")
    with pytest.raises(TilestoreError, match="unexpected keyword"):
        compute_tissue(open_slide(stores(CMU)), "otsu", radius=3)


def test_label_image_is_valid_ome_zarr_and_round_trips(writable):
    slide = writable(CMU)
    tissue = compute_tissue(slide)
    write_tissue(slide, tissue)
    root = zarr.open_group(slide.group.store, mode="r")
    image = OmeImage.from_zarr(root)
    assert image.labels.attributes.ome.labels == ["tissue"]
    label = ImageLabel.from_zarr(root["labels/tissue"])
    datasets = label.attributes.ome.multiscales[0].datasets
    assert len(datasets) == len(slide.levels)
    scale = datasets[0].coordinateTransformations[0].scale
    assert scale[1] == pytest.approx(tissue.downsample[0] * 0.499)
    again = read_tissue(open_slide(slide.group.store))
    np.testing.assert_array_equal(again.mask, tissue.mask)
    assert again.downsample == pytest.approx(tissue.downsample)
    write_tissue(slide, compute_tissue(slide, "contrast"))  # replacing keeps it valid
    assert read_tissue(open_slide(slide.group.store)).method == "contrast"
    OmeImage.from_zarr(zarr.open_group(slide.group.store, mode="r"))


SATURATION = st.floats(0, 1, width=32)


@settings(max_examples=200, deadline=None)
@given(
    arrays(np.float32, st.tuples(st.integers(1, 40), st.integers(1, 40)), elements=SATURATION),
    st.integers(1, 6),
)
def test_median_3x3_equals_scipys_rank_filter(image, band):
    with patch.object(tissue, "BAND", band):  # bands on threads: each its rows, none twice
        assert np.array_equal(tissue.median_filter(image, 3), ndimage.median_filter(image, size=3))


@settings(max_examples=300, deadline=None)
@given(
    arrays(np.float32, st.tuples(st.integers(1, 40), st.integers(1, 40)), elements=SATURATION),
    st.integers(1, 6),
    st.floats(0, 0.2),
)
def test_otsu_counted_in_bands_equals_skimages_threshold(signal, band, floor):
    """The histogram counted band by band on threads gives skimage's own threshold_otsu of
    the whole signal: values on a bin edge and the maximum included (one value: itself); a
    range too narrow for 256 bins (subnormal) refused alike, with numpy's ValueError."""
    from skimage import filters

    banded = patch.object(tissue, "BAND", band), patch.object(tissue, "usable_cpus", lambda: 3)
    try:
        want = float(signal.flat[0]) if np.ptp(signal) == 0 else filters.threshold_otsu(signal)
    except ValueError as refused:
        with banded[0], banded[1], pytest.raises(ValueError, match=re.escape(str(refused))):
            tissue._otsu_threshold(signal, floor)
        return
    with banded[0], banded[1]:
        assert tissue._otsu_threshold(signal, floor) == max(float(want), floor)


@settings(max_examples=300, deadline=None)
@given(
    arrays(bool, st.tuples(st.integers(1, 30), st.integers(1, 30))),
    st.integers(1, 5),
)
def test_closing_by_a_disk_equals_scipys(mask, radius):
    """Shifted ORs then ANDs (`close_disk`) close a mask exactly as scipy's binary_closing
    with skimage's disk does, the border included (nothing from beyond it; beyond it erodes)."""
    from skimage import morphology

    from tilestore.masks.holes import close_disk

    want = ndimage.binary_closing(mask, structure=morphology.disk(radius))
    assert np.array_equal(close_disk(mask, radius), want)


def test_the_brightfield_mask_is_the_same_computed_in_bands_on_threads(stores, monkeypatch):
    """The saturation and its median computed band by band on threads: the very mask one
    band on one thread gives (every band written once, none overlapping)."""
    slide = open_slide(stores(CMU))
    monkeypatch.setattr(tissue, "usable_cpus", lambda: 1)
    monkeypatch.setattr(tissue, "BAND", 10_000)
    whole = compute_tissue(slide, "otsu").mask
    monkeypatch.setattr(tissue, "usable_cpus", lambda: 4)
    monkeypatch.setattr(tissue, "BAND", 7)
    assert whole.any() and np.array_equal(compute_tissue(slide, "otsu").mask, whole)


@settings(max_examples=300, deadline=None)
@given(arrays(bool, st.tuples(st.integers(1, 30), st.integers(1, 30))), st.integers(0, 25))
def test_dropping_small_fragments_keeps_exactly_those_of_min_px_or_more(mask, min_px):
    """Each 4-connected fragment is kept whole where it has at least min_px pixels and gone
    otherwise (sizes counted over the mask's pixels only); nothing outside the mask appears."""
    labels, count = ndimage.label(mask)
    sizes = np.asarray(ndimage.sum(mask, labels, range(1, count + 1)))
    expected = np.isin(labels, 1 + np.flatnonzero(sizes >= min_px)) if min_px > 1 else mask
    assert np.array_equal(tissue._drop_small(mask, min_px), expected)
