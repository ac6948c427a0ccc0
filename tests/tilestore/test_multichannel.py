"""Multichannel and high-bit-depth slides are stored losslessly, with their true channels.

The inputs are written with tifffile from the real DAPI NDPI's pixels: a QPTIFF as an Akoya
Vectra writes it (one greyscale page per marker, QPI XML naming each) and a 5-channel 16-bit
OME-TIFF. Before this, the QPTIFF converted "successfully" as 8-bit RGB brightfield JPEG.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tifffile
import zarr

from tests.conftest import NDPI
from tests.tilestore import tiffs
from tilestore.conversion.converter import convert
from tilestore.errors import TilestoreError
from tilestore.reading.opening import open_slide
from tilestore.sources import open_source

MARKERS = {"DAPI": "0,0,255", "CD8": "0,255,0", "PanCK": "255,0,0"}


@pytest.fixture(scope="module")
def ndpi_pixels(tmp_path_factory):
    from tests.conftest import DATA

    path = DATA / "slides" / NDPI
    if not path.exists():
        pytest.skip(f"real test data not found: {path}")
    return tifffile.imread(path, level=1)  # (2432, 1984, 3) uint8, real DAPI-stained tissue


@pytest.fixture
def qptiff(tmp_path, ndpi_pixels):
    planes = {
        name: (color, ndpi_pixels[..., 2 - i]) for i, (name, color) in enumerate(MARKERS.items())
    }
    return tiffs.qptiff(tmp_path / "vectra.qptiff", planes)


def _levels(store):
    group = zarr.open_group(store, mode="r")
    return [group[str(i)] for i in range(len(group.attrs["ome"]["multiscales"][0]["datasets"]))]


def test_a_qptiff_is_stored_lossless_with_its_channels(qptiff, tmp_path):
    report = convert(qptiff, tmp_path / "out")
    assert report.codec == "zstd" and "fluorescence" in report.codec_reason
    levels = _levels(report.store)
    with tifffile.TiffFile(qptiff) as tif:
        for index, source in enumerate(tif.series[0].levels):
            np.testing.assert_array_equal(levels[index][:], source.asarray())  # bit-exact
    attrs = zarr.open_group(report.store, mode="r").attrs
    channels = attrs["ome"]["omero"]["channels"]
    assert [(c["label"], c["color"]) for c in channels] == [
        ("DAPI", "0000FF"),
        ("CD8", "00FF00"),
        ("PanCK", "FF0000"),
    ]
    # a display window from the data, inside the dtype's range
    assert all(0 <= c["window"]["start"] < c["window"]["end"] <= 255 for c in channels)
    assert attrs["tilestore"]["channels"] == list(MARKERS)
    assert attrs["tilestore"]["modality"]["value"] == "fluorescence"
    assert open_slide(report.store).to_xarray(0).coords["c"].values.tolist() == list(MARKERS)


def test_jpeg_on_fluorescence_is_refused_unless_lossy_is_asked_for(qptiff, tmp_path):
    with pytest.raises(TilestoreError, match=r"would quantise 3 channel\(s\) \(DAPI, CD8, PanCK\)"):
        convert(qptiff, tmp_path / "out", codec="jpeg")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    report = convert(qptiff, tmp_path / "out", codec="jpeg", lossy_ok=True)
    meta = json.loads((report.store / "0" / "zarr.json").read_text())
    # asked for: JPEG, but no colour transform mixing the markers
    inner = meta["codecs"][0]["configuration"]["codecs"]  # in each shard
    assert inner[1]["configuration"]["colorspace_jpeg"] == "RGB"


def test_pages_of_one_sample_are_channels_even_without_vendor_metadata(qptiff, tmp_path):
    """The generic reader decides from the pages themselves, not from the QPI XML."""
    with tifffile.TiffFile(qptiff) as tif:
        planes = tif.series[0].asarray()
    plain = tmp_path / "plain.ome.tif"
    tifffile.imwrite(plain, planes, photometric="minisblack", tile=(256, 256), ome=True)
    with open_source(plain) as source:
        assert source.levels[0].channels == 3 and not source.levels[0].rgb
        assert not source.brightfield_rgb
    assert convert(plain, tmp_path / "out", mpp=0.5).codec == "zstd"


def test_five_channels_of_16_bits_round_trip_bit_exactly(tmp_path, ndpi_pixels):
    rng = np.random.default_rng(5)
    tissue = ndpi_pixels[:1024, :1280].astype(np.uint16)
    image = np.stack(
        [
            tissue[..., i % 3] * (40 + 9 * i) + rng.integers(0, 300, tissue.shape[:2])
            for i in range(5)
        ]
    ).astype(np.uint16)
    names = ["DAPI", "CD3", "CD20", "PD-L1", "Ki67"]
    colors = [0x0000FFFF, 0x00FF00FF, -0x00FFFF01, 0x00FFFFFF, -0x100FF01]  # OME signed RGBA
    src = tiffs.ome_channels(tmp_path / "five.ome.tif", image, names, colors)
    report = convert(src, tmp_path / "out")
    assert report.codec == "zstd"
    levels = _levels(report.store)
    assert levels[0].shape == (5, 1024, 1280) and levels[0].dtype == np.uint16
    assert levels[0].chunks[0] == 1  # one channel per chunk beyond 4
    with tifffile.TiffFile(src) as tif:
        for index, source in enumerate(tif.series[0].levels):
            np.testing.assert_array_equal(levels[index][:], source.asarray())
    channels = zarr.open_group(report.store, mode="r").attrs["ome"]["omero"]["channels"]
    assert [c["label"] for c in channels] == names
    assert [c["color"] for c in channels] == ["0000FF", "00FF00", "FF0000", "00FFFF", "FEFF00"]
    assert all(c["window"]["max"] == 65535 for c in channels)
    assert all(c["window"]["end"] < 65535 for c in channels)  # a window a viewer can show


def test_three_of_sixteen_bit_channels_read_as_an_rgb_picture(tmp_path, ndpi_pixels):
    """What an RGB model gets of a multiplex store: the channels chosen, in that order, each
    scaled from its display window to 0-255 (as a viewer shows it), clipped."""
    rng = np.random.default_rng(7)
    image = rng.integers(0, 4000, (4, 700, 900)).astype(np.uint16)
    image[1] += ndpi_pixels[:700, :900, 2].astype(np.uint16) * 50  # DAPI, up to 16k
    names = ["CD3", "DAPI", "CD20", "Ki67"]
    src = tiffs.ome_channels(tmp_path / "four.ome.tif", image, names, [255] * 4)
    slide = open_slide(convert(src, tmp_path / "out").store)
    with pytest.raises(TilestoreError, match="takes 3 channels, 2 given"):
        slide.as_rgb(["DAPI", "CD3"])
    view = slide.as_rgb(["Ki67", "DAPI", "0"])  # by name or index
    assert view.rgb and view.picked == ("Ki67", "DAPI", "CD3") and not slide.rgb
    shown = zarr.open_group(slide.group.store, mode="r").attrs["ome"]["omero"]["channels"]
    expected = []
    for i in (3, 1, 0):
        lo, hi = shown[i]["window"]["start"], shown[i]["window"]["end"]
        assert 0 <= lo < hi < 65535
        scaled = (image[i, 100:400, 200:700].astype(np.float64) - lo) * 255 / (hi - lo)
        expected.append(np.clip(np.rint(scaled), 0, 255))
    got = view.chunks(0).read(100, 400, 200, 700)
    assert got.dtype == np.uint8 and got.shape == (300, 500, 3)
    assert np.abs(got.astype(int) - np.stack(expected, axis=-1)).max() <= 1  # float32 rounding
    assert (got == 255).any() and (got == 0).any()  # the window clips at both ends
    reader = view.chunks(0)
    (chunk,) = reader.load([(1, 1)])  # whole chunks, as the embedder reads them
    h, w = reader.chunk_h, reader.chunk_w
    np.testing.assert_array_equal(chunk, reader.read(h, 2 * h, w, 2 * w))


def test_fluorescence_tissue_follows_the_nuclear_channel(tmp_path, ndpi_pixels):
    """A marker that glows over the glass (autofluorescence, mounting medium) must not decide
    the mask: it follows DAPI, found by its name, or the channel asked for."""
    from tilestore.masks.tissue import compute_tissue

    dapi = ndpi_pixels[..., 2]
    glow = np.clip(ndpi_pixels[..., 1].astype(np.int16) + 120, 0, 255).astype(np.uint8)
    both = {"Opal 570": ("0,255,0", glow), "DAPI": ("0,0,255", dapi)}
    slide = open_slide(convert(tiffs.qptiff(tmp_path / "a.qptiff", both), tmp_path / "a").store)
    alone = {"DAPI": ("0,0,255", dapi)}
    only = open_slide(convert(tiffs.qptiff(tmp_path / "b.qptiff", alone), tmp_path / "b").store)
    by_name = compute_tissue(slide, mpp=4.0)
    assert any("channel DAPI (by its name)" in n for n in by_name.notes)
    # as from DAPI alone (up to a few edge pixels of the resampled levels)
    assert (by_name.mask != compute_tissue(only, mpp=4.0).mask).mean() < 0.001
    assert 0.05 < by_name.mask.mean() < 0.9
    asked = compute_tissue(slide, mpp=4.0, channel="Opal 570")
    assert (asked.mask != by_name.mask).mean() > 0.05
    by_index = compute_tissue(slide, mpp=4.0, channel="1")
    np.testing.assert_array_equal(by_index.mask, by_name.mask)
    with pytest.raises(TilestoreError, match="no channel 'CD3' \\(channels: Opal 570, DAPI\\)"):
        compute_tissue(slide, mpp=4.0, channel="CD3")


@pytest.fixture
def dimmed(tmp_path, ndpi_pixels):
    """Stores of the real DAPI scan made a multiplex core: DAPI divided by `dim`, and Cy3 a
    bright, smooth stain over the same tissue (the DAPI blurred and tripled)."""
    from scipy import ndimage

    dapi = ndpi_pixels[..., 2]
    cy3 = np.clip(ndimage.gaussian_filter(dapi.astype(np.float32), 6) * 3, 0, 255)

    def store(dim: int):
        planes = {"DAPI": ("0,0,255", dapi // dim), "Cy3": ("255,255,0", cy3.astype(np.uint8))}
        src = tiffs.qptiff(tmp_path / f"dim{dim}.qptiff", planes)
        return open_slide(convert(src, tmp_path / f"dim{dim}").store)

    return store


def test_a_dark_nuclear_channel_falls_back_to_the_brightest_and_says_so(dimmed):
    from tilestore.masks.tissue import compute_tissue

    slide = dimmed(16)  # DAPI at most 15 of 255: its density never reaches the floor
    tissue = compute_tissue(slide)
    cy3 = compute_tissue(slide, channel="Cy3")
    assert 0.5 < cy3.fraction < 0.95
    assert tissue.fraction == pytest.approx(cy3.fraction, abs=0.01)  # Cy3 is the brightest
    assert (
        f"nuclear channel DAPI found no tissue; used the brightest channel at each pixel: "
        f"{tissue.fraction:.1%}" in tissue.notes
    )
    assert "no tissue found" not in tissue.notes
    # asked for, a channel is never replaced; the note says which channels do find tissue
    asked = compute_tissue(slide, channel="DAPI")
    assert not asked.mask.any() and "no tissue found" in asked.notes
    assert f"channel DAPI finds no tissue; channels that do: Cy3 {cy3.fraction:.1%}" in asked.notes


def test_a_nuclear_channel_too_dim_to_split_tissue_from_glass_is_not_trusted(dimmed):
    """Dimmed 8 times, DAPI's Otsu threshold falls under the floor and what passes the floor
    is 3.5% of a core the brightest channel finds 87% of; dimmed 2 times it still keeps
    nearly all its tissue (80% against 82% at full strength) and is kept."""
    from tilestore.masks.tissue import compute_tissue

    slide = dimmed(8)
    dim = compute_tissue(slide, channel="DAPI")
    assert 0 < dim.fraction < 0.1
    tissue = compute_tissue(slide)
    assert tissue.fraction > 0.5
    (note,) = [n for n in tissue.notes if n.startswith("nuclear channel DAPI")]
    assert note == (
        f"nuclear channel DAPI found {dim.fraction:.1%}, too dim to tell tissue from glass "
        f"(Otsu's threshold on it is under min_intensity=0.04); used the brightest channel "
        f"at each pixel: {tissue.fraction:.1%}"
    )
    half = dimmed(2)
    kept = compute_tissue(half)
    np.testing.assert_array_equal(kept.mask, compute_tissue(half, channel="DAPI").mask)
    assert not any(n.startswith("nuclear channel") for n in kept.notes)


def test_an_empty_multiplex_slide_is_still_empty(tmp_path):
    from tilestore.masks.tissue import compute_tissue

    rng = np.random.default_rng(3)
    planes = {n: (c, rng.integers(0, 4, (900, 1100)).astype(np.uint8)) for n, c in MARKERS.items()}
    slide = open_slide(convert(tiffs.qptiff(tmp_path / "e.qptiff", planes), tmp_path / "e").store)
    tissue = compute_tissue(slide)
    assert not tissue.mask.any()
    assert tissue.notes[-2:] == [
        "nuclear channel DAPI found no tissue, nor did the brightest channel",
        "no tissue found",
    ]
    asked = compute_tissue(slide, channel="CD8")
    assert "channel CD8 finds no tissue; nor does any other channel" in asked.notes
