"""The `tilestore` command: output people read, one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import CMU, KIDNEY
from tests.conftest import run_cli as tilestore


@pytest.mark.parametrize("at_once", ["1", "2"])
def test_convert_then_info(tmp_path, slide_path, at_once):
    """A slide's warning is the command's own line, from a slide converted here or in a
    worker process (`--at-once 2`: said again here, not as the worker's Python warning)."""
    args = ("convert", slide_path(CMU), slide_path(KIDNEY), "-o", tmp_path, "--at-once", at_once)
    run = tilestore(*args)
    assert run.returncode == 0, run.stderr
    assert "copy" in run.stdout and "re-encode" in run.stdout
    assert run.stderr.strip().splitlines() == [
        f"tilestore: warning: {slide_path(KIDNEY)}: no pixel size (mpp) in the file; "
        "stored mpp: null (set it with --mpp <um/px>)"
    ]
    info = tilestore("info", tmp_path / "CMU-1-Small-Region.ome.zarr", "--json")
    assert info.returncode == 0
    assert json.loads(info.stdout)["levels"][0]["write"] == "copy"
    table = tilestore("info", tmp_path / "CMU-1-Small-Region.ome.zarr")
    assert "complete" in table.stdout and "0.499" in table.stdout
    assert "GPU JPEG decoding: every level" in " ".join(table.stdout.split())
    zstd = tmp_path / "zstd"
    assert tilestore("convert", slide_path(KIDNEY), "-o", zstd, "--codec", "zstd").returncode == 0
    kidney = json.loads(tilestore("info", zstd / "kidney-48-5.ome.zarr", "--json").stdout)
    assert {lv["gpu_jpeg"] for lv in kidney["levels"]} == {"its chunks are not JPEG"}
    shown = " ".join(tilestore("info", zstd / "kidney-48-5.ome.zarr").stdout.split())
    assert "level 0: its chunks are not JPEG" in shown and "decoded on the CPU" in shown


def test_info_on_a_slide_file(slide_path):
    run = tilestore("info", slide_path(CMU))
    assert run.returncode == 0 and "svs" in run.stdout and "240x240" in run.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "file is empty"), (b"not a slide at all", "not a supported slide")],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, message):
    bad = tmp_path / "bad.svs"
    bad.write_bytes(content)
    run = tilestore("convert", bad, "-o", tmp_path / "out")
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tilestore: error: ")
    assert str(bad) in lines[0] and message in lines[0]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_one_bad_slide_does_not_stop_the_others(tmp_path, slide_path):
    bad = tmp_path / "bad.svs"
    bad.write_bytes(b"")
    run = tilestore("convert", bad, slide_path(CMU), "-o", tmp_path / "out")
    assert run.returncode == 2
    assert (tmp_path / "out" / "CMU-1-Small-Region.ome.zarr" / "zarr.json").exists()


def test_existing_store_error(tmp_path, slide_path):
    assert tilestore("convert", slide_path(CMU), "-o", tmp_path).returncode == 0
    run = tilestore("convert", slide_path(CMU), "-o", tmp_path)
    assert run.returncode == 2 and "--overwrite" in run.stderr


def test_info_on_missing_path(tmp_path):
    run = tilestore("info", tmp_path / "nothing.svs")
    assert run.returncode == 2 and "nothing.svs" in run.stderr


def test_tissue_plan_preview_pipeline(tmp_path, slide_path, annotation_path):
    assert tilestore("convert", slide_path(CMU), "-o", tmp_path).returncode == 0
    store = tmp_path / "CMU-1-Small-Region.ome.zarr"
    run = tilestore("tissue", store, "--preview", tmp_path / "tissue.png")
    assert run.returncode == 0, run.stderr
    assert "tissue covers" in run.stdout and (tmp_path / "tissue.png").stat().st_size > 10_000
    run = tilestore("plan", store, "--mpp", "0.5", "--tile", "224", "--preview", tmp_path / "p.png")
    assert run.returncode == 0, run.stderr
    assert "plan '0.5mpp-224px'" in run.stdout and "chunks of level 0" in run.stdout
    info = json.loads(tilestore("info", store, "--json").stdout)
    assert info["tissue"]["method"] == "otsu" and "0.5mpp-224px" in info["plans"]
    again = tilestore("plan", store)  # the very same plan: kept as it is
    assert again.returncode == 0 and "plan '0.5mpp-224px'" in again.stdout, again.stderr
    other = tilestore("plan", store, "--stride", "112", "--name", "0.5mpp-224px")
    assert (
        other.returncode == 2
        and "--overwrite" in other.stderr
        and "made otherwise" in (other.stderr)
    )


def test_plan_with_points_as_roi_is_refused(tmp_path, slide_path, annotation_path):
    assert tilestore("convert", slide_path(CMU), "-o", tmp_path).returncode == 0
    points = annotation_path("format_samples/qupath-point.json")
    run = tilestore("plan", tmp_path / "CMU-1-Small-Region.ome.zarr", "--roi", points)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"tilestore: error: {points}: no areas to use as a region of interest (found points); "
        "draw polygons, rectangles, ellipses or brush areas"
    ]


def test_embed_and_models_commands(tmp_path, slide_path):
    assert tilestore("convert", slide_path(CMU), "-o", tmp_path).returncode == 0
    store = tmp_path / "CMU-1-Small-Region.ome.zarr"
    run = tilestore(
        "embed",
        store,
        "--model",
        "efficientnet-lite0",
        "--mpp",
        "1",
        "--device",
        "cpu",
        "--report",
        tmp_path / "run.json",
    )
    assert run.returncode == 0, run.stderr
    assert (
        "11 tiles in" in run.stdout
        and json.loads((tmp_path / "run.json").read_text())["tiles"] == 11
    )
    again = tilestore(
        "embed", store, "--model", "efficientnet-lite0", "--mpp", "1", "--device", "cpu"
    )
    assert again.returncode == 0 and "skipped" in again.stdout
    assert "already complete (11 tiles); pass --overwrite" in again.stdout
    listed = tilestore("models", "list")
    assert listed.returncode == 0 and "MahmoodLab/uni" in listed.stdout


def _without_pixel_size(svs, target):
    """The SVS as a tiled TIFF whose pixel size is nowhere recorded (no resolution tags, no
    Aperio description): what a stripped or badly exported slide looks like."""
    import tifffile

    tifffile.imwrite(target, tifffile.imread(svs), tile=(240, 240), compression="jpeg")
    return target


@pytest.mark.parametrize("slide", ["stripped", KIDNEY])
def test_plan_and_embed_treat_a_slide_without_pixel_size_alike(tmp_path, slide_path, slide):
    """One rule everywhere: no recorded pixel size means no tiles at any mpp (asked for or
    the default), refused in one line that says how to give one or to ask for level-0
    pixels; asked for explicitly (--mpp level0), plan and embed both tile level 0."""
    src = (
        _without_pixel_size(slide_path(CMU), tmp_path / "stripped.tif")
        if slide == "stripped"
        else slide_path(slide)
    )
    assert tilestore("convert", src, "-o", tmp_path).returncode == 0
    store = tmp_path / (src.stem + ".ome.zarr")
    embed = ("embed", store, "--model", "efficientnet-lite0", "--device", "cpu", "--into", tmp_path)
    for mpp, shown in ((None, "0.5"), ("0.5", "0.5"), ("1", "1")):
        given = () if mpp is None else ("--mpp", mpp)
        planned = tilestore("plan", store, *given)
        embedded = tilestore(*embed, *given)
        want = (
            f"pixel size unknown, so its tiles cannot be read at {shown} um/px; give the "
            "slide's pixel size (convert again with --mpp <um/px>, or embed the slide file with "
            "--scan-mpp <um/px>), or plan in level-0 pixels explicitly (--mpp level0)"
        )
        assert planned.returncode == 2
        assert planned.stderr.strip() == f"tilestore: error: {store.name}: {want}"
        assert embedded.returncode == 2  # the efficientnet's native mpp is None: 0.5 too
        assert embedded.stderr.splitlines()[-1] == f"tilestore: error: {store}: {want}"
    assert not (store / "plans").exists() and not (store / "embeddings").exists()
    planned = tilestore("plan", store, "--mpp", "level0", "--min-tissue", "0")
    embedded = tilestore(*embed, "--mpp", "level0", "--min-tissue", "0", "--max-tiles", "8")
    assert planned.returncode == 0 and "level0-224px" in planned.stdout
    assert embedded.returncode == 0, embedded.stderr
    assert "224 px tiles at level-0 pixels, magnification UNKNOWN" in embedded.stdout


def test_embed_gated_model_offline_is_one_line(tmp_path, slide_path):
    assert tilestore("convert", slide_path(CMU), "-o", tmp_path).returncode == 0
    env_run = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "embed",
            str(tmp_path / "CMU-1-Small-Region.ome.zarr"),
            "--model",
            "uni",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert env_run.returncode == 2
    lines = env_run.stderr.strip().splitlines()
    assert len(lines) == 1 and "MahmoodLab/uni is not in the local cache" in lines[0]


def test_export_commands(embedded_cohort, tmp_path):
    cmu, ihc = embedded_cohort
    geojson = tmp_path / "cmu.geojson"
    run = tilestore(
        "export", "qupath", cmu, "-m", "efficientnet-lite0", "--clusters", "3", "-o", geojson
    )
    assert run.returncode == 0, run.stderr
    features = json.loads(geojson.read_text())["features"]
    assert f"{len(features)} tiles" in run.stdout
    assert {f["properties"]["classification"]["name"] for f in features} <= {
        "Cluster 0",
        "Cluster 1",
        "Cluster 2",
    }
    assert set(features[0]["properties"]["measurements"]) >= {"PC1", "PC5", "tissue"}
    h5ad = tmp_path / "cohort.h5ad"
    run = tilestore(
        "export", "anndata", cmu, ihc, "-m", "efficientnet-lite0", "-o", h5ad, "--clusters", "2"
    )
    assert run.returncode == 0 and h5ad.exists(), run.stderr
    assert "2 slide(s)" in run.stdout
    png = tmp_path / "map.png"
    run = tilestore("export", "map", cmu, "-m", "efficientnet-lite0", "-o", png, "--clusters", "3")
    assert run.returncode == 0, run.stderr
    assert all(
        p.stat().st_size > 10_000
        for p in (png, tmp_path / "map-clusters.png", tmp_path / "map-gallery.png")
    )


def test_export_of_a_model_never_run_is_one_line(embedded_cohort, tmp_path):
    run = tilestore("export", "qupath", embedded_cohort[0], "-m", "uni", "-o", tmp_path / "x.json")
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert "no embeddings/uni" in line and "embed the store with --model uni first" in line
    assert not (tmp_path / "x.json").exists()


def test_embed_on_a_local_dask_cluster_and_by_shard(tmp_path, stores, slide_path):
    """A store and a slide file on a local cluster: the slide converted by a worker into
    --into; the report says so. --in-place is refused there, in one line."""
    import shutil

    from tests.conftest import IHC

    ihc = tmp_path / "skimage_ihc.ome.zarr"
    shutil.copytree(stores(IHC, mpp=0.5), ihc)
    common = (
        "--model",
        "efficientnet-lite0",
        "--mpp",
        "0.5",
        "--device",
        "cpu",
        "--batch-size",
        "8",
    )
    first = tilestore("embed", ihc, *common, "--shard", "1/2")
    assert first.returncode == 0, first.stderr
    assert "shard 1/2: 0 store(s)" in first.stdout  # one store: share 1 of 2 is empty
    svs, into = slide_path(CMU), tmp_path / "into"
    run = tilestore(
        "embed",
        svs,
        ihc,
        *common,
        "--cluster",
        "local",
        "--workers",
        "2",
        "--into",
        into,
        "--report",
        tmp_path / "cohort.json",
    )
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "cohort.json").read_text())
    made = into / "CMU-1-Small-Region.ome.zarr"
    assert report["workers"] == 2 and not report["failures"]
    assert {s["store"] for s in report["slides"]} == {str(made), str(ihc)}
    assert [c["slide"] for c in report["converted"]] == [str(svs)]
    assert "tiles on 2 worker(s)" in run.stdout and f"converted {svs} -> {made}" in run.stdout
    both = tilestore("embed", ihc, *common, "--cluster", "local", "--scheduler", "x:1")
    assert both.returncode == 2 and "give one" in both.stderr
    sidecars = tmp_path / "sidecars"
    in_place = tilestore(
        "embed", svs, *common, "--cluster", "local", "--in-place", "--sidecars", sidecars
    )
    assert in_place.returncode == 2
    (line,) = in_place.stderr.strip().splitlines()
    assert f"{svs}: --in-place is not run on Dask: give --into DIR" in line
    assert not sidecars.exists()


def test_no_checksums_writes_the_older_form_that_info_and_verify_name(tmp_path, slide_path):
    run = tilestore("convert", slide_path(CMU), "-o", tmp_path, "--no-checksums")
    assert run.returncode == 0, run.stderr
    store = tmp_path / "CMU-1-Small-Region.ome.zarr"
    level = json.loads((store / "0" / "zarr.json").read_text())
    assert "crc32c" not in json.dumps(level["codecs"])
    assert "every chunk written, no checksums" in tilestore("info", store).stdout
    verify = tilestore("verify", "--decode", store)
    assert verify.returncode == 0, verify.stderr
    assert "without checksums" in verify.stdout


def test_a_slide_coarser_than_the_plan_is_refused_alike_by_plan_and_embed(tmp_path, slide_path):
    """The CAMELYON DICOM's finest level is 29 um/px: tiles at 0.5 um/px would be 4 px
    windows enlarged 58x. Both commands refuse in one line naming both resolutions;
    --upsample plans them anyway, and a plan at the slide's resolution needs nothing."""
    dcm = slide_path("camelyon_lymphnode_jpeg.dcm")
    assert tilestore("convert", dcm, "-o", tmp_path).returncode == 0
    (store,) = tmp_path.glob("*.ome.zarr")
    planned = tilestore("plan", store)
    embedded = tilestore(
        "embed", store, "--model", "efficientnet-lite0", "--device", "cpu", "--into", tmp_path
    )
    for run in (planned, embedded):
        assert run.returncode == 2
        last = run.stderr.strip().splitlines()[-1]
        assert "um/px, coarser than the 0.5 um/px asked" in last and "--upsample" in last
    assert not (store / "plans").exists() and not (store / "embeddings").exists()
    assert tilestore("plan", store, "--upsample", "--min-tissue", "0").returncode == 0
    assert tilestore("plan", store, "--mpp", "30", "--tile", "32", "--name", "own").returncode == 0


def test_another_plan_on_an_embedded_store_is_never_already_complete(tmp_path, slide_path):
    """Another plan's embeddings of the model are made beside the first (one model's groups
    of several plans side by side), never answered "already complete" and never replacing
    them; a plan of the first's name made otherwise is refused in one line, by the run and
    its dry run alike (the run replaced the stored plan before: issue 69); --overwrite
    replaces it."""
    assert tilestore("convert", slide_path(CMU), "-o", tmp_path).returncode == 0
    store = tmp_path / "CMU-1-Small-Region.ome.zarr"
    base = ("embed", store, "--model", "efficientnet-lite0", "--device", "cpu", "--mpp", "1")
    assert tilestore(*base).returncode == 0
    groups = store / "embeddings" / "efficientnet-lite0"
    first = (groups / "1mpp-224px" / "features" / "zarr.json").read_bytes()
    for other, name in (
        (("--min-tissue", "0.9"), "1mpp-224px-t0.9"),
        (("--stride", "112"), "1mpp-224px-s112"),
    ):
        run = tilestore(*base, *other)
        assert run.returncode == 0, run.stderr
        assert "already complete" not in run.stdout + run.stderr
        assert (groups / name / "done").is_dir()
    assert (groups / "1mpp-224px" / "features" / "zarr.json").read_bytes() == first  # kept
    named = (*base, "--stride", "112", "--name", "1mpp-224px")
    dry = tilestore(*named, "--dry-run")
    run = tilestore(*named)
    assert run.returncode == 2 and dry.returncode == 2
    (said,) = dry.stderr.strip().splitlines()
    assert said.startswith(f"tilestore: error: {store.name}: plan '1mpp-224px' is stored already")
    assert "stride=224 -> 112" in " ".join(said.split()) or "--stride 224 -> 112" in said
    assert "already complete" not in run.stdout + run.stderr


def test_a_slide_without_pixel_size_read_in_place_says_so_and_takes_one(tmp_path, slide_path):
    """Read in place, a TIFF without a recorded pixel size is said so in the run's own terms
    (never a raw Python warning from the worker), the plan is refused as everywhere, and
    --scan-mpp gives the slide its pixel size."""
    src = _without_pixel_size(slide_path(CMU), tmp_path / "stripped.tif")
    run = ("embed", src, "--in-place", "--model", "efficientnet-lite0", "--device", "cpu")
    refused = tilestore(*run, "--sidecars", tmp_path / "a", "--mpp", "1")
    assert refused.returncode == 2
    assert "TilestoreWarning" not in refused.stderr and ".py:" not in refused.stderr
    assert "no pixel size (mpp) in the file; stored mpp: null (set it with --scan-mpp" in (
        refused.stderr
    )
    assert any("pixel size unknown" in line for line in refused.stderr.splitlines())
    given = tilestore(*run, "--sidecars", tmp_path / "b", "--mpp", "1", "--scan-mpp", "0.499")
    assert given.returncode == 0, given.stderr
    assert "TilestoreWarning" not in given.stderr
    assert "11 tiles in" in given.stdout


def test_a_sidecar_made_with_another_pixel_size_is_refused_not_reused(tmp_path, slide_path):
    """--scan-mpp asks for a pixel size: a sidecar made before with another is refused in
    one line, never read at the resolution it recorded."""
    src = _without_pixel_size(slide_path(CMU), tmp_path / "stripped.tif")
    run = (
        "embed",
        src,
        "--in-place",
        "--sidecars",
        tmp_path / "side",
        "--model",
        "efficientnet-lite0",
        "--device",
        "cpu",
        "--mpp",
        "1",
        "--max-tiles",
        "8",
    )
    assert tilestore(*run, "--scan-mpp", "0.499").returncode == 0
    other = tilestore(*run, "--scan-mpp", "0.25")
    assert other.returncode == 2
    sidecar = tmp_path / "side" / "stripped.tif.tilestore.zarr"
    assert f"{sidecar}: made before with 0.499 um/px, not the 0.25 um/px asked" in other.stderr
    assert tilestore(*run, "--scan-mpp", "0.499").returncode == 0  # the same: reused


def test_convert_mpp_supplies_a_missing_size_and_overrides_only_when_asked(tmp_path, slide_path):
    """`convert --mpp 0.25` on a slide that states 0.499 um/px replaced it without a word:
    now refused in one line naming the file, both sizes and --override-mpp, nothing made;
    with --override-mpp the store records the override and `info` says so."""
    src = slide_path(CMU)
    refused = tilestore("convert", src, "-o", tmp_path / "a", "--mpp", "0.25")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == (
        f"tilestore: error: {src}: the file states 0.499 um/px (SVS ImageDescription MPP), "
        "not the 0.25 um/px given (--mpp 0.25), which supplies a missing pixel size only: "
        "leave it out to use the file's, or add --override-mpp to replace it (recorded as an "
        "override)"
    )
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())
    made = tilestore("convert", src, "-o", tmp_path / "b", "--mpp", "0.25", "--override-mpp")
    assert made.returncode == 0, made.stderr
    info = tilestore("info", tmp_path / "b" / "CMU-1-Small-Region.ome.zarr")
    assert "mpp: 0.25 x 0.25 µm/px, an OVERRIDE of the file's 0.499 x 0.499 µm/px (SVS " in (
        " ".join(info.stdout.split())
    )


def test_embed_scan_mpp_never_replaces_a_files_size_silently_nor_reuses_an_override(
    tmp_path, slide_path
):
    """The cohort reproducer: `embed CMU.svs --into d --scan-mpp 0.2527` stored CMU (0.499
    um/px in its file) as 0.2527, and a rerun without the flag reused it. Now the flag is
    refused in the run's own terms; with --override-mpp the slide's line says the override;
    a rerun asking no override (or another) refuses the store, which is kept."""
    src, into = slide_path(CMU), tmp_path / "cohortA"
    run = ("embed", src, "--into", into, "--model", "efficientnet-lite0", "--device", "cpu",
           "--mpp", "1", "--max-tiles", "4")  # fmt: skip
    refused = tilestore(*run, "--scan-mpp", "0.2527")
    assert refused.returncode == 2
    assert (
        "the file states 0.499 um/px (SVS ImageDescription MPP), not the 0.2527 um/px given "
        "(--scan-mpp 0.2527)"
        in refused.stderr
        and "add --override-mpp to replace it" in refused.stderr
    )
    assert not (into / "CMU-1-Small-Region.ome.zarr").exists()
    made = tilestore(*run, "--scan-mpp", "0.2527", "--override-mpp")
    assert made.returncode == 0, made.stderr
    assert (
        "level-0 pixel size 0.2527 um/px, OVERRIDE of the file's 0.499 um/px "
        "(SVS ImageDescription MPP)" in " ".join(made.stdout.split())
    )
    for other in ((), ("--scan-mpp", "0.3", "--override-mpp")):
        again = tilestore(*run, *other)
        assert again.returncode == 2
        assert "(reused)" not in again.stdout and "already complete" not in again.stdout
        assert "made before with 0.2527 um/px by override of the file's 0.499 um/px" in (
            again.stderr
        )
    same = tilestore(*run, "--scan-mpp", "0.2527", "--override-mpp")
    assert same.returncode == 0 and "(reused)" in same.stdout


def test_features_past_float16s_range_fail_the_slide_with_exit_2(tmp_path, stores):
    """A model whose features pass float16's range (a ViT whose last norm is scaled by 1e6):
    stored as float16 the slide fails in one line naming the tiles and the fix, exit 2,
    nothing written (it stored infinities and said it was done); --dtype float32 keeps them."""
    import shutil

    import numpy as np
    import timm
    import torch
    import zarr

    from tests.embed.conftest import write_checkpoint

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, depth=1)
    with torch.no_grad():
        model.norm.weight.mul_(1e6)
    folder = tmp_path / "scaled"
    folder.mkdir()
    config = {"architecture": "vit_tiny_patch16_224", "model_args": {"depth": 1},
              "pretrained_cfg": {"input_size": [3, 224, 224], "mean": [0.5] * 3,
                                 "std": [0.5] * 3, "interpolation": "bilinear"}}  # fmt: skip
    write_checkpoint(folder, model, config, "model.safetensors")
    store = tmp_path / stores(CMU).name
    shutil.copytree(stores(CMU), store)
    command = ("embed", store, "--model", f"local:{folder}", "--mpp", "1", "--device", "cpu")
    run = tilestore(*command)
    assert run.returncode == 2, (run.stdout, run.stderr)
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("tilestore: error: ")]
    assert f"{store}: local:{folder} made NaN or infinite features for " in line
    assert "tile(s) of batch 0 (plan tile, level-0 x, y: 0 at (" in line
    assert "infinities, no NaN: float16 stores so what passes its range (65504)" in line
    assert "--dtype float32 would keep them" in line
    assert "(nothing was written: embeddings/local-" in line
    assert line.endswith(" removed, the store is as it was)")
    assert not [p for p in (store / "embeddings").glob("*") if p.is_dir()]
    kept = tilestore(*command, "--dtype", "float32")
    assert kept.returncode == 0, kept.stderr
    (group,) = [p for p in (store / "embeddings").glob("*/*") if (p / "features").is_dir()]
    features = zarr.open_array(group / "features", mode="r")[:]  # embeddings/<model>/<plan>
    assert np.isfinite(features).all() and np.abs(features).max() > 65504
