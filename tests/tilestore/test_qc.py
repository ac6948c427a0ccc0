"""QC: detectors measured against artefacts painted on real H&E, labels/qc in the store,
plans that drop artefact tiles, the tutorial's contrast filter, the cohort report."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import tifffile
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage

import tilestore
from tests.conftest import CMU
from tests.tilestore import artefacts as A
from tilestore.errors import PlanError, TilestoreError
from tilestore.masks.contrast import ContrastRule
from tilestore.plan import PlanOptions, load_plan, plan_over_tissue, save_plan
from tilestore.qc import (
    QCOptions,
    compute_qc,
    qc_cohort,
    qc_store,
    read_qc,
    read_summary,
    write_qc,
)
from tilestore.qc.report import write_report

MARGIN_UM = 40  # a detector's context: the rim of a painted region is neither clean nor truth


@pytest.fixture(scope="module")
def painted(tmp_path_factory, cmu_pixels_module):
    """Stores of CMU-1-Small-Region with one painted artefact each (and one clean)."""
    root = tmp_path_factory.mktemp("painted")
    clean = A.Case("clean", "", cmu_pixels_module, np.zeros(cmu_pixels_module.shape[:2], bool))
    made = {}
    for case in [clean, *A.cases(cmu_pixels_module)]:
        name = case.name.replace(" ", "_")
        tifffile.imwrite(root / f"{name}.tif", case.image, tile=(256, 256), compression="zlib")
        tilestore.convert(root / f"{name}.tif", root / f"{name}.ome.zarr", mpp=A.MPP)
        made[case.name] = (case, root / f"{name}.ome.zarr")
    return made


@pytest.fixture(scope="module")
def cmu_pixels_module(request):
    from tests.conftest import SLIDES, real

    return tifffile.imread(real(SLIDES / CMU))


def _scores(case: A.Case, maps) -> tuple[float, float]:
    """(IoU of the case's detector with the truth, share of clean tissue any detector
    flagged), on the map's grid."""
    truth = A.on_grid(case.truth, maps.downsample, maps.bits.shape)
    margin = round(MARGIN_UM / maps.mpp)
    near = ndimage.binary_dilation(truth, iterations=margin) if truth.any() else truth
    clean = maps.tissue & ~near
    flagged = float((maps.bits > 0)[clean].mean())
    if not case.detector:
        return 1.0, flagged
    found = maps.mask(case.detector)
    seen = truth if case.detector in ("pen", "bubble") else truth & maps.tissue
    return float((found & seen).sum() / max((found | seen).sum(), 1)), flagged


ACCURATE = [
    "blur sigma 4 um",
    "blur sigma 8 um",
    "blue pen",
    "green pen",
    "black pen",
    "red pen",
    "fold",
    "air bubble",
    "under-exposed",
]


@pytest.mark.parametrize("name", ACCURATE)
def test_detector_finds_the_painted_artefact(painted, name):
    case, path = painted[name]
    maps = compute_qc(tilestore.open_slide(path), QCOptions(device="cpu"))
    iou, flagged = _scores(case, maps)
    assert iou >= 0.8, f"{name}: IoU {iou:.3f}"
    assert flagged <= 0.02, f"{name}: {flagged:.1%} of clean tissue flagged"


def test_clean_slide_is_almost_unflagged(painted):
    case, path = painted["clean"]
    maps = compute_qc(tilestore.open_slide(path), QCOptions(device="cpu"))
    _, flagged = _scores(case, maps)
    assert flagged <= 0.01
    assert not maps.mask("pen").any() and not maps.mask("blur").any()


def test_qc_is_stored_as_a_label_image_and_a_summary(painted, tmp_path):
    import shutil

    import zarr

    _, path = painted["fold"]
    store = tmp_path / "fold.ome.zarr"
    shutil.copytree(path, store)
    slide = tilestore.open_slide(store)
    maps = compute_qc(slide, QCOptions(device="cpu"))
    summary = write_qc(slide, maps)
    assert summary["flags"] == ["fold"]
    assert 0.1 < summary["fractions"]["fold"] < 0.3
    assert summary["tissue_mm2"] == pytest.approx(0.6, abs=0.2)
    stored = read_qc(tilestore.open_slide(store))
    assert np.array_equal(stored.label, maps.label())
    assert stored.classes == list(maps.classes)
    group = zarr.open_group(store / "labels" / "qc", mode="r")
    label_meta = group.attrs["ome"]["image-label"]
    names = {p["label-value"]: p["name"] for p in label_meta["properties"]}
    assert names[0] == "none" and names[maps.classes.index("fold") + 1] == "fold"
    assert len(group.attrs["ome"]["multiscales"][0]["datasets"]) == len(slide.levels)
    assert read_summary(tilestore.open_slide(store))["fractions"] == summary["fractions"]


def test_label_takes_the_first_detector_that_fired():
    from tilestore.qc.maps import QCMaps

    bits = np.array([[0, 1, 2, 3, 6, 64]], np.uint8)
    maps = QCMaps(
        bits, ["a", "b", "c", "d", "e", "f", "g"], (1, 1), 1, 0, bits > 0, None, {}, "cpu", 0
    )
    assert maps.label().tolist() == [[0, 1, 2, 1, 2, 7]]


def test_plan_carries_artefact_shares_and_drops_tiles(painted, tmp_path):
    import shutil

    _, path = painted["fold"]
    store = tmp_path / "s.ome.zarr"
    shutil.copytree(path, store)
    slide = tilestore.open_slide(store)
    with pytest.raises(PlanError, match="tilestore qc"):
        plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=112, max_artefact=0.1))
    write_qc(slide, compute_qc(slide, QCOptions(device="cpu")))
    full = plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=112))
    assert set(full.qc) == set(QCOptions().detectors)
    assert full.qc["fold"].max() > 0.9 and full.qc["pen"].max() == 0
    kept = plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=112, max_artefact=0.1))
    assert len(kept) == int(
        (
            full.qc["fold"]
            + full.qc["blur"]
            + full.qc["stain"]
            + full.qc["dark"]
            + full.qc["bright"]
            + full.qc["pen"]
            + full.qc["bubble"]
            <= 0.1
        ).sum()
    )
    assert len(kept) < len(full)
    only_pen = plan_over_tissue(
        slide, PlanOptions(mpp=0.5, tile=112, max_artefact=0.1, exclude=("pen",))
    )
    assert len(only_pen) == len(full)  # no pen on this slide: nothing dropped
    with pytest.raises(TilestoreError, match=r"exclude=.wet.: not an artefact; choose pen"):
        plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=112, max_artefact=0.1, exclude=("wet",)))
    save_plan(slide, kept)
    loaded, _ = load_plan(tilestore.open_slide(store), kept.name)
    assert np.array_equal(loaded.qc["fold"], kept.qc["fold"])
    assert (loaded.qc["fold"] <= 0.1).all()


def test_contrast_filter_keeps_exactly_the_tutorial_tiles(stores, cmu_pixels_module, tmp_path):
    import shutil

    store = tmp_path / "cmu.ome.zarr"
    shutil.copytree(stores(CMU), store)
    image = cmu_pixels_module
    # the tutorial's loop: every whole 256 px tile of level 0, one at a time
    expected = set()
    for y in range(0, image.shape[0] - 256 + 1, 256):
        for x in range(0, image.shape[1] - 256 + 1, 256):
            tile = image[y : y + 256, x : x + 256]
            if (
                tile.min() < 135
                and tile.max() >= 255
                and np.percentile(tile, 5) < 162
                and np.median(tile) < 225
            ):
                expected.add((x, y))
    slide = tilestore.open_slide(store)
    plan = plan_over_tissue(slide, PlanOptions(mpp="level0", tile=256, filter="contrast"))
    assert set(zip(plan.x.tolist(), plan.y.tolist(), strict=True)) == expected
    assert 0 < len(expected) < (image.shape[0] // 256) * (image.shape[1] // 256)
    stricter = plan_over_tissue(
        slide,
        PlanOptions(
            mpp="level0", tile=256, filter="contrast", contrast=ContrastRule(max_median=200)
        ),
    )
    assert set(zip(stricter.x.tolist(), stricter.y.tolist(), strict=True)) < expected


def test_unknown_filter_and_detector_are_refused(stores, tmp_path):
    slide = tilestore.open_slide(stores(CMU))
    with pytest.raises(TilestoreError, match="filter='sharpness': must be 'contrast'"):
        plan_over_tissue(slide, PlanOptions(filter="sharpness"), store_tissue=False)
    with pytest.raises(TilestoreError, match="detectors='pen,wet': choose among pen, bubble"):
        compute_qc(slide, QCOptions(detectors=("pen", "wet")))
    with pytest.raises(TilestoreError, match="blur"):
        compute_qc(slide, QCOptions(detectors=("pen",), params={"blur": {"max_ratio": 1}}))
    with pytest.raises(TilestoreError, match="max_rati"):
        compute_qc(slide, QCOptions(params={"blur": {"max_rati": 1}}))


def test_cohort_report_table_and_page(painted, tmp_path):
    import shutil

    paths = []
    for name in ("clean", "fold", "blue pen"):
        _, src = painted[name]
        paths.append(tmp_path / src.name)
        shutil.copytree(src, paths[-1])
    broken = tmp_path / "broken.ome.zarr"
    broken.mkdir()
    (broken / "zarr.json").write_text("{not json")
    results, _ = qc_cohort([*paths, broken], QCOptions(device="cpu"))
    assert [r.error is None for r in results] == [True, True, True, False]
    assert "broken.ome.zarr" in results[-1].error
    out = write_report(results, tmp_path / "report")
    frame = pd.read_parquet(out["parquet"])
    assert list(frame["slide"]) == ["clean", "fold", "blue_pen", "broken"]
    assert frame.loc[1, "flags"].split() == ["fold"]
    assert "pen" in frame.loc[2, "flags"].split()
    assert frame.loc[3, "error"]
    assert pd.read_csv(out["csv"])["fold_fraction"].iloc[1] == pytest.approx(
        frame["fold_fraction"].iloc[1]
    )
    page = out["html"].read_text()
    assert page.count("<tr") == 5 and page.count("data:image/jpeg;base64,") == 6
    assert "3 flagged" in page or "flagged" in page


def test_cli_qc_plan_and_embed_columns(painted, tmp_path):
    import shutil

    _, src = painted["fold"]
    store = tmp_path / "f.ome.zarr"
    shutil.copytree(src, store)
    cli = [sys.executable, "-m", "tilestore.cli"]
    run = subprocess.run(
        [*cli, "qc", str(store), "--device", "cpu", "--report", str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "FLAGGED: fold" in run.stdout
    assert (tmp_path / "r" / "qc.html").exists()
    run = subprocess.run(
        [*cli, "plan", str(store), "--tile", "112", "--max-artefact", "0.1", "--exclude", "fold"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "qc0.1-fold" in run.stdout
    bad = subprocess.run(
        [*cli, "qc", str(tmp_path / "nowhere.ome.zarr"), "--device", "cpu"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "nowhere.ome.zarr" in bad.stderr


def test_fluorescence_is_refused_not_judged_by_brightfield_rules(stores):
    from tests.conftest import SLIDES, real

    slide = tilestore.open_slide(stores("stritt_test3-DAPI-2-387.ndpi"))
    real(SLIDES / "stritt_test3-DAPI-2-387.ndpi")
    with pytest.raises(TilestoreError, match="fluorescence"):
        compute_qc(slide, QCOptions(device="cpu"))


def test_a_slide_coarser_than_the_maps_is_refused_and_a_cohort_goes_on(stores, tmp_path):
    coarse = stores("camelyon_lymphnode_jpeg.dcm")  # CAMELYON's 29 um/px level
    with pytest.raises(TilestoreError, match=r"scanned at 29 um/px, coarser than the 4 um/px"):
        compute_qc(tilestore.open_slide(coarse), QCOptions(device="cpu"))
    fine = tmp_path / "fine.ome.zarr"
    shutil.copytree(stores(CMU), fine)
    rows, _ = qc_cohort([coarse, fine], QCOptions(device="cpu"))
    assert rows[0].error is None and "coarser than the 4 um/px" in rows[0].not_judged
    assert rows[1].error is None and rows[1].summary is not None
    frame = pd.read_parquet(write_report(rows, tmp_path / "report")["parquet"])
    assert list(frame["judged"]) == [False, True] and "coarser" in frame.loc[0, "why_not_judged"]


def test_qc_of_a_cohort_with_slides_it_does_not_judge_says_so_and_succeeds(stores, tmp_path):
    """A fluorescence slide and one scanned coarser than the maps are facts about those
    slides, not failures: each gets a 'not judged' line, the run exits 0; a damaged store
    is still an error (exit 2)."""
    fine = tmp_path / "fine.ome.zarr"
    shutil.copytree(stores(CMU), fine)
    dapi, coarse = stores("stritt_test3-DAPI-2-387.ndpi"), stores("camelyon_lymphnode_jpeg.dcm")
    cli = [sys.executable, "-m", "tilestore.cli", "qc", "--device", "cpu"]
    run = subprocess.run([*cli, dapi, coarse, fine], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    said = " ".join(run.stdout.split())
    assert said.count("not judged: ") == 2 and "fluorescence" in said and "coarser" in said
    assert "1 of 3 slides judged" in said and "(2 not judged)" in said
    broken = subprocess.run([*cli, fine, tmp_path / "nowhere.ome.zarr"], capture_output=True)
    assert broken.returncode == 2


def test_blur_is_not_judged_without_a_pixel_size(stores):
    """Focus compares texture at micrometre scales: at a guessed pixel size it called a
    sharp DAB-stained gland of scikit-image's IHC picture 23% blurred."""
    slide = tilestore.open_slide(stores("skimage_ihc.png"))
    assert slide.mpp is None
    maps = compute_qc(slide, QCOptions(device="cpu"))
    assert "blur" not in maps.classes and "pen" in maps.classes and maps.not_judged == ["blur"]
    assert "blur not judged: the slide's pixel size is unknown" in maps.notes
    assert not maps.bits.any()
    with pytest.raises(TilestoreError, match=r"blur need the slide's pixel size"):
        compute_qc(slide, QCOptions(device="cpu", detectors=("blur",)))


def test_the_report_says_not_judged_rather_than_nothing_found(stores, tmp_path):
    ihc, cmu = tmp_path / "ihc.ome.zarr", tmp_path / "cmu.ome.zarr"
    shutil.copytree(stores("skimage_ihc.png"), ihc)
    shutil.copytree(stores(CMU), cmu)
    results, _ = qc_cohort([ihc, cmu], QCOptions(device="cpu"))
    assert results[0].summary["not_judged"] == ["blur"] and not results[1].summary["not_judged"]
    out = write_report(results, tmp_path / "report")
    frame = pd.read_parquet(out["parquet"])
    assert list(frame["not_judged"]) == ["blur", ""]
    assert np.isnan(frame.loc[0, "blur_fraction"]) and frame.loc[1, "blur_fraction"] == 0
    assert out["html"].read_text().count("not judged") == 1


def test_a_qc_preview_has_a_legend_of_what_was_looked_for(stores, tmp_path):
    """The PNG says which colour is which artefact and how much of the tissue each covers,
    below the slide, in the classes' own colours."""
    from PIL import Image

    from tilestore.qc.classes import ARTEFACTS

    store = tmp_path / "cmu.ome.zarr"
    shutil.copytree(stores(CMU), store)
    result = qc_store(store, QCOptions(device="cpu"), preview=tmp_path / "previews")
    png = Image.open(tmp_path / "previews" / "cmu.qc.png").convert("RGB")
    slide = tilestore.open_slide(store)
    _, h0, w0 = slide.shape
    assert png.height > round(1600 * h0 / max(h0, w0)) + 10  # a strip below the picture
    strip = np.asarray(png)[round(1600 * h0 / max(h0, w0)) :]
    colours = {tuple(c) for c in strip.reshape(-1, 3)}
    looked = result.summary["fractions"].keys()
    assert all(ARTEFACTS[n].rgba[:3] in colours for n in looked)


def test_a_small_fragment_is_measured_as_tissue_not_as_the_glass_around_it(stores):
    """kidney-48-5 is glass but for one small IHC fragment: too small to measure on a read
    4x coarser than the maps, so it is measured finer, never by the whole (glass) slide.
    Its stain density was 0.015 (glass) before."""
    from tilestore.qc.maps import GLASS_OD

    slide = tilestore.open_slide(stores("kidney-48-5.tif"))
    maps = compute_qc(slide, QCOptions(device="cpu"))
    assert maps.stats.od_median > GLASS_OD  # what is not glass


@pytest.mark.parametrize("mode", ["full", "sparse"])
def test_blur_of_one_micrometre_is_found_by_the_fine_pass(cmu_pixels_module, tmp_path, mode):
    """A 1 um Gaussian blur, invisible at the maps' 4 um/px, is found by the fine pass at
    0.5 um/px, in full and in the CPU's sparse pass alike; the maps alone find a quarter."""
    case = A.blurred(cmu_pixels_module, 1.0)
    tifffile.imwrite(tmp_path / "b.tif", case.image, tile=(256, 256), compression="zlib")
    tilestore.convert(tmp_path / "b.tif", tmp_path / "b.ome.zarr", mpp=A.MPP)
    slide = tilestore.open_slide(tmp_path / "b.ome.zarr")
    maps = compute_qc(slide, QCOptions(device="cpu", fine_blur=mode))
    iou, flagged = _scores(case, maps)
    assert iou >= 0.75 and flagged <= 0.02
    assert any(n.startswith("fine blur: ") for n in maps.notes)
    off = compute_qc(slide, QCOptions(device="cpu", fine_blur="off"))
    assert _scores(case, off)[0] < iou - 0.3
    with pytest.raises(
        TilestoreError, match="fine_blur='some': must be one of 'auto', 'full', 'sparse', 'off'"
    ):
        compute_qc(slide, QCOptions(device="cpu", fine_blur="some"))


def test_the_fine_pass_agrees_with_the_per_tile_blur(cmu_pixels_module):
    """A cell the fine pass judges is judged by the embedding pass's own measure: the same
    numbers for the same pixels."""
    import torch

    from tilestore.qc.tilewise import tile_blur, tile_measures

    cells = torch.from_numpy(np.stack([cmu_pixels_module[y : y + 64, 900:964] for y in
                                       range(1500, 2300, 64)]))  # fmt: skip
    torch.testing.assert_close(tile_blur(cells, 0.5), tile_measures(cells, 0.5)[:, 0],
                               equal_nan=True)  # fmt: skip


@given(
    start=st.integers(0, 5000),
    length=st.integers(1, 3000),
    side=st.floats(1.0, 1024.0, allow_nan=False),
)
def test_the_fine_pass_counts_the_chunks_a_read_decodes(start, length, side):
    """What the fine pass weighs a box read against single-cell reads by: the chunks a run
    of pixels touches, against counting them pixel by pixel."""
    from tilestore.qc.fine import spanned

    touched = {int(p // side) for p in range(start, start + length)}
    assert spanned(start, start + length, side) == len(touched)


@pytest.fixture(scope="module")
def cmu_at(tmp_path_factory, cmu_pixels_module):
    """CMU-1-Small-Region converted as scanned at a given um/px (0.499: the fine pass reads
    level 0 as it is; 0.3: it resamples), one store per um/px."""
    root = tmp_path_factory.mktemp("cells")
    tif = root / "cmu.tif"
    tifffile.imwrite(tif, cmu_pixels_module, tile=(256, 256), compression="zlib")
    made = {}

    def at(mpp: float):
        if mpp not in made:
            made[mpp] = root / f"cmu-{mpp}.ome.zarr"
            tilestore.convert(tif, made[mpp], mpp=mpp)
        return tilestore.open_slide(made[mpp])

    return at


@pytest.mark.parametrize("mpp", [0.499, 0.3])
@given(row=st.integers(0, 8), col=st.integers(0, 6), rows=st.integers(1, 5),
       cols=st.integers(1, 12))  # fmt: skip
@settings(max_examples=15, deadline=None)
def test_a_box_of_cells_holds_the_pixels_of_each_cell_read_alone(cmu_at, mpp, row, col, rows,
                                                                 cols):  # fmt: skip
    """The fine pass reads a window's cells as one box or one by one, whichever decodes
    fewer chunks: both must judge each cell on the same pixels (cells are 64.13 level-0
    px apart at 4 um/px maps; cut 64 px apart, a box's 20th cell sat 2 px off)."""
    from tilestore.qc.fine import Cells

    slide = cmu_at(mpp)
    dx = 4.0 / mpp
    cells = Cells(size=8, px=64, mpp=0.5, downsample=(dx, dx))
    box = cells.read(slide, row, col, rows, cols)
    assert box.shape == (rows, cols, 64, 64, 3)
    for i in range(rows):
        for j in range(cols):
            np.testing.assert_array_equal(
                box[i, j], cells.read(slide, row + i, col + j, 1, 1)[0, 0]
            )
    x, y = round((col + cols - 1) * 8 * dx), round((row + rows - 1) * 8 * dx)
    np.testing.assert_array_equal(box[-1, -1], slide.read_region(x, y, 64, 64, mpp=0.5))
