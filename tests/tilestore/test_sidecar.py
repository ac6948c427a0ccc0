"""TIFF slides read in place: a sidecar store (beside the slide, or in a folder the user
names) holds everything but the slide's own tiles, which are read from the TIFF tile by
tile; only `open_in_place` makes one, the slide is never written and a changed slide is
refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.conftest import NDPI
from tests.tilestore import tiffs
from tilestore.conversion import open_in_place
from tilestore.conversion.converter import convert
from tilestore.embed.engine import embed
from tilestore.embed.models import load_model
from tilestore.embed.settings import Options
from tilestore.embeddings import open_embeddings
from tilestore.errors import StoreError
from tilestore.plan import PlanOptions, load_plan
from tilestore.reading import open_sidecar, open_slide, sidecar_for
from tilestore.reading import source_chunks as chunks_module
from tilestore.sources import open_source

FP32 = Options(batch_size=4, device="cpu", precision="fp32", dtype="float32")


@pytest.fixture
def ome_tiff(tmp_path, cmu_pixels):
    return tiffs.ome_pyramid(tmp_path / "slide.ome.tif", np.ascontiguousarray(cmu_pixels), 0.5)


@pytest.fixture
def counted(monkeypatch):
    """The slide tiles read in place, (row, col) per call."""
    reads = []
    original = chunks_module.TileSource.chunk

    def chunk(self, row, col, plane=0):
        reads.append((row, col))
        return original(self, row, col, plane)

    monkeypatch.setattr(chunks_module.TileSource, "chunk", chunk)
    return reads


def test_read_in_place_equals_the_converted_store(ome_tiff, tmp_path):
    before = ome_tiff.read_bytes()
    slide = open_in_place(ome_tiff)
    converted = open_slide(convert(ome_tiff, tmp_path / "stores").store)
    assert slide.name == ome_tiff.name and len(slide.levels) == len(converted.levels)
    for index in range(len(slide.levels)):
        np.testing.assert_array_equal(
            slide.to_dask(index).compute(), converted.to_dask(index).compute()
        )
    sidecar = sidecar_for(ome_tiff)
    assert not (sidecar / "0" / "c").exists()  # level 0 stays in the slide
    assert slide.record.levels[0].facts["write"] == "in place"
    assert ome_tiff.read_bytes() == before  # the slide is never written


def test_a_region_reads_only_the_tiles_it_touches(ome_tiff, counted):
    slide = open_in_place(ome_tiff)
    counted.clear()
    slide.read_region(
        300, 500, 256, 256, level=0
    )  # 256 px tiles: x 256-767 and y 256-767 are 2 x 2
    assert sorted(set(counted)) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert len(counted) == 4  # each once


def test_roi_embed_from_the_tiff_equals_the_converted_store(ome_tiff, tmp_path, counted):
    roi = tmp_path / "roi.geojson"
    square = [[600, 700], [1300, 700], [1300, 1400], [600, 1400], [600, 700]]
    roi.write_text(
        json.dumps(
            {
                "type": "Feature",
                "geometry": {"type": "Polygon", "coordinates": [square]},
                "properties": {"classification": {"name": "Tumor"}},
            }
        )
    )
    plan = PlanOptions(mpp=0.5, tile=224, roi=str(roi), min_tissue=0)
    lite = load_model("efficientnet-lite0")
    counted.clear()
    report = embed([ome_tiff], lite, plan=plan, options=FP32, in_place=True)
    assert not report.failures and report.tiles > 0
    slide = open_slide(sidecar_for(ome_tiff))  # the sidecar store opens through its slide
    tile_plan, _ = load_plan(slide)
    needed = {tuple(rc) for rc in tile_plan.needed_chunks().tolist()}
    assert set(counted) == needed  # only the tiles under the plan's tiles were read
    store = convert(ome_tiff, tmp_path / "stores").store
    embed([store], lite, plan=plan, options=FP32)
    ours = open_embeddings([sidecar_for(ome_tiff)], "efficientnet-lite0")
    theirs = open_embeddings([store], "efficientnet-lite0")
    np.testing.assert_array_equal(ours.features.values, theirs.features.values)  # bitwise


def test_a_changed_slide_is_refused(ome_tiff, tmp_path, cmu_pixels):
    open_in_place(ome_tiff)
    other = tiffs.ome_pyramid(tmp_path / "other.tif", np.ascontiguousarray(cmu_pixels[::-1]), 0.5)
    shutil.copyfile(other, ome_tiff)  # the same name, other tiles
    with pytest.raises(StoreError, match=r"not the slide its sidecar .* was made from"):
        open_in_place(ome_tiff)
    with pytest.raises(StoreError, match=r"not the slide its sidecar .* was made from"):
        open_slide(sidecar_for(ome_tiff))


def _listing(folder):
    return sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir())


def test_opening_never_makes_a_sidecar(ome_tiff):
    """Reading is not writing: a slide file given to open_slide, or to open_sidecar before
    one was made, is refused with how to read it, and nothing appears beside it."""
    before = _listing(ome_tiff.parent)
    with pytest.raises(StoreError, match=r"a slide file, not a store: .*open_in_place"):
        open_slide(ome_tiff)
    with pytest.raises(StoreError, match=r"no sidecar at .*open_in_place"):
        open_sidecar(ome_tiff)
    assert _listing(ome_tiff.parent) == before


def test_sidecars_go_in_the_folder_named(ome_tiff, tmp_path):
    """Slide archives are often read-only: the sidecar goes where the user says, the slide's
    folder is left as it was, and the sidecar opens again from there (by slide or store)."""
    archive = tmp_path / "archive"
    archive.mkdir()
    ome_tiff = ome_tiff.rename(archive / ome_tiff.name)
    before = _listing(archive)
    folder = tmp_path / "sidecars"
    slide = open_in_place(ome_tiff, folder)
    assert _listing(archive) == before
    assert (folder / f"{ome_tiff.name}.tilestore.zarr" / "zarr.json").is_file()
    again = open_sidecar(ome_tiff, folder)
    by_store = open_slide(folder / f"{ome_tiff.name}.tilestore.zarr")
    assert again.name == by_store.name == slide.name == ome_tiff.name
    np.testing.assert_array_equal(
        by_store.read_region(0, 0, 512, 512, level=0), slide.read_region(0, 0, 512, 512, level=0)
    )


def test_a_sidecar_whose_slide_moved_says_so(ome_tiff, tmp_path):
    open_in_place(ome_tiff, tmp_path / "sidecars")
    ome_tiff.rename(tmp_path / "moved.ome.tif")
    with pytest.raises(StoreError, match=r"reads its levels from .*slide.ome.tif, which is not"):
        open_slide(tmp_path / "sidecars" / "slide.ome.tif.tilestore.zarr")


def test_slides_without_jpeg_tiles_are_decoded_in_place_exactly(slide_path, tmp_path, cmu_pixels):
    """NDPI's JPEG strips and a striped TIFF: no tile can be a chunk as it is, so each chunk
    is decoded from the slide as it is read, equal to the slide's own pixels (where a
    conversion would re-encode the striped TIFF); nothing of level 0 is in the sidecar."""
    import tifffile

    ndpi = tmp_path / NDPI
    shutil.copyfile(slide_path(NDPI), ndpi)
    striped = tmp_path / "striped.tif"
    tifffile.imwrite(
        striped,
        cmu_pixels,
        compression="jpeg",
        photometric="rgb",
        rowsperstrip=16,
        resolution=(20_000, 20_000),
        resolutionunit="CENTIMETER",  # 0.5 um/px
    )
    for path in (ndpi, striped):
        slide = open_in_place(path)
        assert slide.record.levels[0].facts["reason"] == "decoded from the slide at each read"
        with open_source(path) as source:  # the slide's reader, decoding every level whole
            for index, level in enumerate(source.levels):
                h, w = level.shape
                expected = np.moveaxis(level.read(0, h, 0, w), -1, 0)
                np.testing.assert_array_equal(slide.to_dask(index).compute(), expected)
        assert not (sidecar_for(path) / "0" / "c").exists()


def test_verify_checks_a_sidecars_levels_in_the_slide(slide_path, tmp_path):
    """A sidecar's in-place levels are not missing chunks: verify reads each of them from
    the slide (every tile's bytes compared with those recorded) and reports a damaged tile
    there, naming it."""
    from tests import corpus as C
    from tilestore.reading import verify_store

    good = tmp_path / "good.svs"
    shutil.copyfile(slide_path("CMU-1-Small-Region.svs"), good)
    open_in_place(good, tmp_path / "side")
    result = verify_store(tmp_path / "side" / "good.svs.tilestore.zarr")
    assert result.ok and result.chunks > 130 and result.unchecked == []  # 130 in the slide
    zeroed = C.tile_damage("zeroed")(tmp_path, slide_path("CMU-1-Small-Region.svs"))
    shutil.copyfile(zeroed, good)  # damaged where it lies: its tile index, so its fingerprint,
    for decode in (False, True):  # are unchanged; its bytes differ from those recorded
        (bad,) = verify_store(tmp_path / "side" / "good.svs.tilestore.zarr", decode=decode).bad
        assert bad.startswith(f"{good}: level 0 tile (4, 0) has changed since its sidecar")
