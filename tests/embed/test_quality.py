"""Per-tile quality in the embedding pass: each tile's measures computed from the tile the
model reads, stored beside its features, opened as columns, summarised in the report; blur
painted on real H&E flagged where it was painted and nowhere else."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
import tifffile
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.conftest import group_of
from tests.tilestore import artefacts as A
from tilestore.embed.engine import embed
from tilestore.embed.settings import Options
from tilestore.embeddings import open_embeddings
from tilestore.plan import PlanOptions, load_plan
from tilestore.plan.tiles import iter_tiles
from tilestore.qc.tilewise import MEASURES, TileLimits, tile_measures
from tilestore.reading.opening import open_slide

PLAN = PlanOptions(mpp=0.5, tile=224)
FP32 = Options(batch_size=16, device="cpu", precision="fp32", dtype="float32", quality=True)
MODEL = "efficientnet-lite0"


def group(path):
    import zarr

    return zarr.open_group(path / group_of(path, MODEL), mode="r")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_stored_measures_are_those_of_the_tiles_the_model_read(store, lite, dtype):
    """... to float32's precision, whatever the features are stored as."""
    path = store()
    report = embed([path], lite, plan=PLAN, options=replace(FP32, dtype=dtype))
    assert group(path)["features"].dtype == np.dtype(dtype)
    stored = group(path)["quality"]
    # the stored columns, written out: a store's format, not whatever MEASURES says today
    assert list(stored.attrs["measures"]) == [
        "blur", "tissue_px", "brightness", "saturation", "ink", "dark", "bright"
    ]  # fmt: skip
    slide = open_slide(path)
    plan, _ = load_plan(slide)
    tiles = np.stack([tile for _, tile in iter_tiles(slide, plan)])
    want = tile_measures(torch.from_numpy(tiles), 0.5).numpy()
    np.testing.assert_allclose(stored[:], want, rtol=1e-5, atol=1e-6, equal_nan=True)
    ds = open_embeddings(path, MODEL)
    np.testing.assert_array_equal(np.asarray(ds["blur"]), stored[:, 0])
    assert report.slides[0]["quality"]["tiles"] == len(plan)
    meta = group(path).attrs["tilestore"]
    assert meta["quality"]["mpp"] == 0.5 and meta["quality_summary"]["tiles"] == len(plan)


@pytest.fixture(scope="module")
def painted(tmp_path_factory, cmu_pixels):
    """CMU-1-Small-Region with a 400 um square blurred by a Gaussian of 1.5 um."""
    import tilestore

    root = tmp_path_factory.mktemp("blurred")
    case = A.blurred(cmu_pixels, 1.5)
    tifffile.imwrite(root / "blurred.tif", case.image, tile=(256, 256), compression="zlib")
    tilestore.convert(root / "blurred.tif", root / "blurred.ome.zarr", mpp=A.MPP)
    return root / "blurred.ome.zarr", case.truth


def test_blur_painted_on_real_tissue_is_flagged_there_and_only_there(painted, lite, tmp_path):
    path = shutil.copytree(painted[0], tmp_path / "blurred.ome.zarr")
    truth = painted[1]
    report = embed([path], lite, plan=PLAN, options=FP32)
    ds = open_embeddings(path, MODEL)
    x, y = np.asarray(ds["x"]), np.asarray(ds["y"])
    inside = np.array([truth[b : b + 224, a : a + 224].all() for a, b in zip(x, y, strict=True)])
    outside = np.array(
        [not truth[b : b + 224, a : a + 224].any() for a, b in zip(x, y, strict=True)]
    )
    blur = np.asarray(ds["blur"])
    judged = np.isfinite(blur)
    limit = TileLimits().max_blur
    assert inside.sum() >= 4 and (blur[inside & judged] > limit).all()
    assert (blur[outside & judged] <= limit).all()
    flagged = report.slides[0]["quality"]["flagged"]["blur"]
    assert flagged == int((np.nan_to_num(blur, nan=0) > limit).sum()) >= inside.sum()


def test_a_plan_at_another_resolution_is_not_judged(store, lite):
    path = store()
    report = embed([path], lite, plan=PlanOptions(mpp=1.0, tile=224), options=FP32)
    assert np.isnan(group(path)["quality"][:]).all()
    note = report.slides[0]["quality"]["note"]
    assert note == (
        "quality not judged: the plan's tiles are 224 px at 0.998 um/px and the measures "
        "are taken on 224 px at 0.5 um/px (the run's)"
    )


def test_quality_off_stores_features_only_and_a_cohort_fills_nan(store, painted, lite, tmp_path):
    with_q = store()
    without = shutil.copytree(painted[0], tmp_path / "without.ome.zarr")
    embed([with_q], lite, plan=PLAN, options=FP32)
    embed([without], lite, plan=PLAN, options=replace(FP32, quality=False))
    assert "quality" not in group(without)
    ds = open_embeddings([with_q, without], MODEL)
    blur = np.asarray(ds["blur"])
    n = group(with_q)["features"].shape[0]
    assert np.isfinite(blur[:n]).any() and np.isnan(blur[n:]).all()


def test_a_run_with_other_quality_does_not_resume_the_group(store, lite):
    path = store()
    embed([path], lite, plan=PLAN, options=replace(FP32, quality=False, max_tiles=16))
    report = embed([path], lite, plan=PLAN, options=FP32)
    assert report.failures and "quality" in report.failures[0]["error"]


def _edit_model(path, edit) -> None:
    import zarr

    group = zarr.open_group(path / group_of(path, MODEL), mode="r+")
    meta = dict(group.attrs["tilestore"])
    meta["model"] = edit(dict(meta["model"]))
    group.attrs["tilestore"] = meta


def test_a_group_begun_before_the_weights_were_recorded_resumes(store, lite):
    """A run before the weights' sha256 was recorded: its unfinished group resumes as the
    refusal's advice says (same options), compared on the facts it has."""
    path = store()
    embed([path], lite, plan=PLAN, options=replace(FP32, max_tiles=16))
    _edit_model(path, lambda m: {k: v for k, v in m.items() if k != "weights_sha256"})
    report = embed([path], lite, plan=PLAN, options=FP32)
    assert not report.failures and group(path).attrs["tilestore"]["complete"]


def test_a_group_begun_with_other_weights_is_not_resumed(store, lite):
    path = store()
    embed([path], lite, plan=PLAN, options=replace(FP32, max_tiles=16))
    _edit_model(path, lambda m: {**m, "weights_sha256": "0" * 64})
    report = embed([path], lite, plan=PLAN, options=FP32)
    assert report.failures and "other settings (model)" in report.failures[0]["error"]


def test_a_later_plan_and_the_accessor_leave_blurred_tiles_out(painted, lite, tmp_path):
    from tilestore.embeddings import plan_slide
    from tilestore.errors import PlanError

    path = shutil.copytree(painted[0], tmp_path / "blurred.ome.zarr")
    embed([path], lite, plan=PLAN, options=FP32)
    ds = open_embeddings(path, MODEL)
    blur = np.asarray(ds["blur"])
    sharp = ds.tiles.keep(max_blur=0.7)
    assert sharp.sizes["tile"] == int((np.nan_to_num(blur, nan=0) <= 0.7).sum())
    assert sharp.sizes["tile"] < ds.sizes["tile"] and (np.nan_to_num(sharp["blur"]) <= 0.7).all()
    with pytest.raises(Exception, match=r"keep\(blurry=\.\.\.\): give max_<column>"):
        ds.tiles.keep(blurry=1)

    slide = open_slide(path)
    made = plan_slide(slide, replace(PLAN, max_blur=0.7))
    assert len(made) == sharp.sizes["tile"] and made.params["max_blur"] == 0.7
    assert any("tiles dropped" in n for n in made.notes) and made.name.endswith("-blur0.7")
    with pytest.raises(PlanError, match=r"no per-tile measures of 'uni'"):
        plan_slide(slide, replace(PLAN, max_blur=0.7, quality_from="uni"))
    # measures whose zarr.json was edited to 3 rows are refused, not matched to other tiles
    from tests.corpus import shape_edited
    from tilestore.errors import DamagedEmbeddings

    shape_edited(path / group_of(path, MODEL) / "quality", 3)
    with pytest.raises(DamagedEmbeddings, match=r"/quality has shape \(3, \d+\) where the group"):
        plan_slide(open_slide(path), replace(PLAN, max_blur=0.7))


def test_a_larger_footprint_is_measured_as_the_model_sees_it(cmu_pixels):
    """A footprint read at a finer level (448 px of a 0.25 um/px level for 224 px tiles at
    0.5) is brought to the model's 224 px, antialiased, before it is measured."""
    import torch.nn.functional as F

    from tilestore.embed.forward import QualityLayout

    big = torch.from_numpy(np.stack([cmu_pixels[:448, :448], cmu_pixels[1000:1448, 800:1248]]))
    small = F.interpolate(big.permute(0, 3, 1, 2).float(), size=(224, 224), mode="bilinear",
                          antialias=True).round().clamp(0, 255).to(torch.uint8)  # fmt: skip
    want = tile_measures(small.permute(0, 2, 3, 1).contiguous(), 0.5)
    layout = QualityLayout(0.5, 224)
    torch.testing.assert_close(layout.measure(big), want, equal_nan=True)
    same = big[:, :224, :224]
    torch.testing.assert_close(layout.measure(same), tile_measures(same, 0.5), equal_nan=True)


def _tiles(cmu_pixels, n: int = 4) -> torch.Tensor:
    return torch.from_numpy(np.stack([cmu_pixels[i * 200 : i * 200 + 224, :224] for i in range(n)]))


def test_given_their_tables_the_measures_copy_nothing_to_the_device(cmu_pixels, monkeypatch):
    """Each tensor made from host data is a copy to the device, and on a GPU a copy that
    waits for everything queued before it (the model's batch): with the tables made once,
    a batch's measures make none, and give the same numbers as without."""
    from tilestore.qc.tilewise import TileTables

    tiles = _tiles(cmu_pixels)
    tables = TileTables.on("cpu", (224, 224), 0.5)
    want = tile_measures(tiles, 0.5)

    def refused(*args, **kwargs):
        raise AssertionError("a tensor made from host data inside the measures")

    monkeypatch.setattr(torch, "tensor", refused)
    monkeypatch.setattr(torch, "as_tensor", refused)
    got = tile_measures(tiles, 0.5, tables=tables)
    with pytest.raises(AssertionError, match="host data"):
        tile_measures(tiles, 0.5)  # without them, they are made for the call
    monkeypatch.undo()
    assert torch.equal(torch.nan_to_num(got, 7.0), torch.nan_to_num(want, 7.0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_the_measures_never_wait_on_the_device(cmu_pixels):
    """torch's sync debug mode raises on any step that makes the host wait for the GPU.
    On the GPU the blur's Gaussians are half-precision matrix products: the blur column
    within 1e-3 of the CPU's convolutions in fp32, the others as they are."""
    from tilestore.qc.tilewise import TileTables

    tiles = _tiles(cmu_pixels).cuda()
    tables = TileTables.on("cuda", (224, 224), 0.5)
    assert tables.gaussians is not None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = tile_measures(tiles, 0.5, tables=tables)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = tile_measures(tiles.cpu(), 0.5)
    torch.testing.assert_close(got.cpu()[:, 0], want[:, 0], equal_nan=True, rtol=0, atol=1e-3)
    torch.testing.assert_close(got.cpu()[:, 1:], want[:, 1:], equal_nan=True, rtol=1e-4, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(4, 48),
    w=st.integers(4, 48),
    sigma=st.floats(0.0, 6.0),
    seed=st.integers(0, 2**16),
)
def test_the_gaussian_as_matrices_is_the_convolution(h, w, sigma, seed):
    """The blur a GPU runs as matrix products equals the convolution, edges reflected,
    wherever the Gaussian reaches no further than the shorter side (both stop there)."""
    from tilestore.qc.tilewise import blur_exact, blur_matrices, gaussian_matrix

    assume(3 * sigma <= min(h, w) - 1 or h == w)
    images = torch.rand((3, h, w), generator=torch.Generator().manual_seed(seed))
    got = blur_matrices(images, gaussian_matrix(h, sigma), gaussian_matrix(w, sigma))
    torch.testing.assert_close(got, blur_exact(images, sigma), rtol=0, atol=1e-5)
    assert torch.allclose(gaussian_matrix(w, sigma).sum(1), torch.ones(w))  # light kept


def test_the_gpus_half_precision_band_pass_keeps_the_blur_to_1e_3(cmu_pixels):
    """The measures with the Gaussians as half-precision matrices (what a GPU runs), here
    on the CPU: every column as the convolutions give it, the blur within 1e-3."""
    from scipy import ndimage

    from tilestore.qc.tilewise import TileParams, TileTables, _band_sigmas, gaussian_matrix

    band = cmu_pixels[1200:1424, 800:2144]  # five tissue tiles, then glass
    soft = ndimage.gaussian_filter(band, (3, 3, 0))  # out of focus by 1.5 um at 0.5 um/px
    tiles = torch.from_numpy(np.stack([b[:, x : x + 224] for b in (band, soft)
                                       for x in range(0, 1121, 224)]))  # fmt: skip
    fp32 = tile_measures(tiles, 0.5)
    matrices = tuple(
        (gaussian_matrix(224, sigma, dtype=torch.float16),) * 2
        for sigma in _band_sigmas(0.5, TileParams())
    )
    half = replace(TileTables.on("cpu", (224, 224), 0.5), gaussians=matrices)
    got = tile_measures(tiles, 0.5, tables=half)
    assert torch.isfinite(fp32[:, 0]).sum() == 10  # tissue tiles judged, sharp and soft
    assert fp32[6:, 0].nanmean() > fp32[:6, 0].nanmean() + 0.1
    torch.testing.assert_close(got[:, 0], fp32[:, 0], rtol=0, atol=1e-3, equal_nan=True)
    torch.testing.assert_close(got[:, 1:], fp32[:, 1:], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("case", [*A.INKS, "under-exposed"])
def test_ink_and_dark_painted_on_real_tissue_flag_the_tiles_there_only(cmu_pixels, case):
    """Each marker ink and an under-exposed region painted on CMU-1: every 224 px tile
    inside the paint is over its limit (ink, dark), no tile 40 um clear of it is."""
    from scipy import ndimage

    painted = A.darkened(cmu_pixels) if case == "under-exposed" else A.inked(cmu_pixels, case)
    h, w = painted.truth.shape
    corners = [(y, x) for y in range(0, h - 223, 168) for x in range(0, w - 223, 168)]
    tiles = torch.from_numpy(
        np.stack([painted.image[y : y + 224, x : x + 224] for y, x in corners])
    )
    measures = tile_measures(tiles, A.MPP)
    flagged = TileLimits().flagged(measures.numpy(), list(MEASURES))
    kind = "dark" if case == "under-exposed" else "ink"
    near = ndimage.binary_dilation(painted.truth, iterations=round(40 / A.MPP))
    inside = np.array([painted.truth[y : y + 224, x : x + 224].all() for y, x in corners])
    clear = np.array([not near[y : y + 224, x : x + 224].any() for y, x in corners])
    assert inside.sum() >= 3 and clear.sum() >= 20
    assert flagged[kind][inside].all()
    assert not flagged[kind][clear].any()
    assert not any(flagged[other][clear].any() for other in flagged)  # clean tissue: nothing


def test_a_group_measured_on_other_colour_cells_is_not_resumed(store, lite):
    """The measures' parameters are part of what a run stores: an unfinished group whose
    colour cells were 2 um (the grid before 4 um) is not topped up with 4 um measures."""
    import zarr

    path = store()
    embed([path], lite, plan=PLAN, options=replace(FP32, max_tiles=16))
    made = zarr.open_group(path / group_of(path, MODEL), mode="r+")
    attrs = dict(made.attrs["tilestore"])
    assert attrs["quality"]["params"]["colour_cell_um"] == 4.0
    attrs["quality"] = {**attrs["quality"], "params": {**attrs["quality"]["params"],
                                                       "colour_cell_um": 2.0}}  # fmt: skip
    made.attrs["tilestore"] = attrs
    report = embed([path], lite, plan=PLAN, options=FP32)
    assert report.failures and "quality" in report.failures[0]["error"]


def test_tables_made_for_other_parameters_are_not_used(cmu_pixels):
    from tilestore.qc.tilewise import TileParams, TileTables

    tiles = _tiles(cmu_pixels)
    other = TileTables.on("cpu", (224, 224), 0.5, TileParams(colour_cell_um=2.0))
    assert TileTables.fitting(other, tiles, 0.5, TileParams()) is not other
    assert TileTables.fitting(other, tiles, 0.5, other.params) is other
    assert TileTables.fitting(other, tiles, 0.25, other.params) is not other
    got, want = tile_measures(tiles, 0.5, tables=other), tile_measures(tiles, 0.5)
    assert torch.equal(torch.nan_to_num(got, 7.0), torch.nan_to_num(want, 7.0))
