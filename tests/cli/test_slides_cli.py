"""`tilestore embed --slide-encoder`, `export h5` and `export slides` as a user runs them:
real tile features of a real slide, one-line refusals with exit code 2."""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd
import pytest

import tilestore
from tests.cli.test_cli import tilestore as run
from tests.conftest import group_of
from tests.corpus import EMBEDDINGS_DAMAGE, damage_embeddings
from tilestore.embeddings.slides import read_slide_vector, slide_group_name


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, stores):
    """CMU-1-Small-Region, its tiles embedded with efficientnet-lite0 and then pooled into a
    slide embedding, by one command."""
    import shutil

    from tests.conftest import CMU

    path = tmp_path_factory.mktemp("slides") / "CMU-1-Small-Region.ome.zarr"
    shutil.copytree(stores(CMU), path)
    done = run("embed", path, "--model", "efficientnet-lite0", "--slide-encoder", "mean",
               "--device", "cpu", "--batch-size", "16")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "mean from 45 efficientnet-lite0 tiles" in done.stdout
    return path


def test_embed_then_pool_in_one_command_gives_the_mean_of_the_real_features(embedded):
    tiles = tilestore.open_embeddings([embedded], "efficientnet-lite0")
    vector = read_slide_vector(embedded, "efficientnet-lite0", "mean")["vector"]
    stored = tiles.features.values.astype(np.float64)  # float16 as stored
    np.testing.assert_allclose(vector, stored.mean(0), rtol=1e-5, atol=1e-6)
    again = run("embed", embedded, "--model", "efficientnet-lite0", "--slide-encoder", "mean",
                "--device", "cpu")  # fmt: skip
    assert again.returncode == 0 and "skipped (done already)" in again.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slide-encoder", "titan", "--mpp", "1"],
         "--mpp 1: titan reads conch-v1.5 tiles of 512 px at 0.5 um/px; leave it out"),
        (["--slide-encoder", "titan", "--model", "uni"],
         "titan reads conch-v1.5 tile features, not uni: leave --model out"),
        (["--slide-encoder", "nope"], "unknown slide encoder 'nope'"),
        (["--model", "efficientnet-lite0", "--slide-weights", "w.pth"],
         "--slide-weights goes with --slide-encoder"),
        (["--slide-encoder", "mean"], "mean pools any tile model's features: name one"),
        ([], "--model: which model embeds the tiles?"),
    ],
)  # fmt: skip
def test_refusals_are_one_line_and_exit_2(embedded, args, message):
    done = run("embed", embedded, *args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tilestore: error: ") and message in lines[0]


def test_eagle_without_its_guide_features_is_refused_before_any_tile_is_embedded(embedded):
    """EAGLE reads chief-ctranspath features of the Virchow2 tiles' plan: a store without
    them is refused at the door, not after the Virchow2 run."""
    done = run("embed", embedded, "--slide-encoder", "eagle", "--device", "cpu")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    said = "eagle is guided by chief-ctranspath features of the same tiles (plan 2mpp-224px)"
    assert line.startswith(f"tilestore: error: {said}: 1 of 1 store(s) lack them (first: ")
    assert line.endswith("--model chief-ctranspath --mpp 2 --tile 224 --any-scale first")
    assert not (embedded / "embeddings" / "virchow2-cls").exists()


def test_a_slide_encoder_refuses_tile_features_it_was_not_made_for(embedded):
    done = run("embed", embedded, "--model", "efficientnet-lite0", "--slide-encoder",
               "random:chief", "--device", "cpu")  # fmt: skip
    assert done.returncode == 2
    assert "random:chief reads chief-ctranspath tile features, not efficientnet-lite0" in (
        done.stderr
    )


def test_export_h5_is_tridents_layout(embedded, tmp_path):
    done = run("export", "h5", embedded, "-m", "efficientnet-lite0", "-o", tmp_path)
    assert done.returncode == 0, done.stderr
    tiles = tilestore.open_embeddings([embedded], "efficientnet-lite0")
    with h5py.File(tmp_path / "CMU-1-Small-Region.h5") as f:
        np.testing.assert_array_equal(f["features"][:], tiles.features.values.astype(np.float32))
        assert f["features"].dtype == np.float32
        coords = f["coords"][:]
        attrs = dict(f["coords"].attrs)
    assert coords.dtype == np.int64
    np.testing.assert_array_equal(coords, np.stack([tiles.x.values, tiles.y.values], 1))
    assert attrs["patch_size"] == 224 and attrs["patch_size_level0"] == 224
    assert attrs["level0_magnification"] == 20 and attrs["target_magnification"] == 20
    assert (attrs["level0_width"], attrs["level0_height"]) == (2220, 2967)
    assert attrs["overlap"] == 0 and attrs["patch_level"] == 0
    # TITAN's and Prov-GigaPath's grid: coords // patch_size_level0 is each tile's cell
    np.testing.assert_array_equal(coords // 224, np.stack([tiles.col, tiles.row], 1))
    again = run("export", "h5", embedded, "-m", "efficientnet-lite0", "-o", tmp_path)
    assert again.returncode == 2 and "exists; pass --overwrite" in again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CMU-1-Small-Region.h5"]


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".h5ad"])
def test_export_slides_writes_a_row_per_slide(embedded, tmp_path, suffix):
    target = tmp_path / f"slides{suffix}"
    done = run("export", "slides", embedded, "-m", "efficientnet-lite0", "-s", "mean", "-o",
               target)  # fmt: skip
    assert done.returncode == 0, done.stderr
    vector = read_slide_vector(embedded, "efficientnet-lite0", "mean")["vector"]
    if suffix == ".h5ad":
        import anndata

        adata = anndata.read_h5ad(target)
        assert adata.shape == (1, 1280) and adata.obs.index[0] == "CMU-1-Small-Region"
        np.testing.assert_allclose(adata.X[0], vector)
        return
    table = pd.read_parquet(target) if suffix == ".parquet" else pd.read_csv(target)
    assert list(table.columns[:3]) == ["slide", "store", "tiles"] and table["tiles"][0] == 45
    np.testing.assert_allclose(table.iloc[0, 3:].to_numpy(float), vector, rtol=1e-6)


def test_models_list_shows_the_slide_encoders(tmp_path):
    done = run("models", "list")
    assert done.returncode == 0
    assert "slide encoder" in done.stdout and "titan" in done.stdout
    assert "MahmoodLab/TITAN" in done.stdout and "CHIEF_pretraining.pth (a file)" in done.stdout
    # each one's facts, its authors' precision, whether it makes patient vectors, cached
    row = next(line.split() for line in done.stdout.splitlines() if line.startswith("moozy "))
    assert row == ["moozy", "lunit-vits8", "0.5", "224", "768", "yes", "AtlasAnalyticsLab/MOOZY",
                   "CC-BY-NC-SA-4.0", "no", "fp32", "no"]  # fmt: skip
    titan = next(line.split() for line in done.stdout.splitlines() if line.startswith("titan "))
    assert titan[5] == "no" and titan[-2:] == ["fp16", "no"]


def test_export_h5_in_stamps_layout(embedded, tmp_path):
    done = run("export", "h5", embedded, "-m", "efficientnet-lite0", "-o", tmp_path,
               "--layout", "stamp")  # fmt: skip
    assert done.returncode == 0, done.stderr
    tiles = tilestore.open_embeddings([embedded], "efficientnet-lite0")
    with h5py.File(tmp_path / "CMU-1-Small-Region.h5") as f:
        assert set(f) == {"feats", "coords"}
        np.testing.assert_allclose(f["coords"][:, 0], tiles.x_um.values)
        np.testing.assert_allclose(f["coords"][:, 1], tiles.y_um.values)
        attrs = dict(f.attrs)
    assert attrs["unit"] == "um" and attrs["feat_type"] == "tile"
    assert attrs["tile_size_px"] == 224 and attrs["tile_size_um"] == pytest.approx(224 * 0.499)
    assert attrs["extractor"] == "efficientnet-lite0"


@pytest.mark.parametrize("kind", EMBEDDINGS_DAMAGE)
def test_damaged_tile_features_are_refused_by_every_command(embedded, tmp_path, kind):
    """NaN or infinite tile features (and the slide vector a slide encoder made of them
    before: their mean), or features' zarr.json edited to 3 rows: `export slides`, `export
    h5` and `embed --slide-encoder mean` each refuse in one line naming the store and the
    array, exit 2, and write nothing (they wrote a table and a slide vector of NaN, and an
    .h5 of 3 features beside 45 coordinates)."""
    import shutil

    import zarr

    path = tmp_path / "stores" / embedded.name
    shutil.copytree(embedded, path)
    said = damage_embeddings(path, "efficientnet-lite0", kind)
    tiles = group_of(path, "efficientnet-lite0")
    vector = zarr.open_array(path / slide_group_name(tiles, "mean") / "embedding", mode="r+")
    # `export slides` reads the slide vectors: of damaged shapes it is told by the tile
    # group, of NaN by the vector the features made
    said_of_vectors = said
    if kind != "rows":
        features = zarr.open_array(path / group_of(path, "efficientnet-lite0") / "features")
        with np.errstate(invalid="ignore"):
            vector[:] = features[:].astype(np.float64).mean(0)  # what `mean` made of them
        said_of_vectors = "slides/mean/embedding holds NaN or infinite values in "
    before = vector[:]
    commands = {
        "export slides": ("export", "slides", path, "-m", "efficientnet-lite0", "-s", "mean",
                          "-o", tmp_path / "slides.csv"),
        "export h5": ("export", "h5", path, "-m", "efficientnet-lite0", "-o", tmp_path / "h5"),
        "embed": ("embed", path, "--model", "efficientnet-lite0", "--slide-encoder", "mean",
                  "--device", "cpu"),
    }  # fmt: skip
    for name, command in commands.items():
        done = run(*command)
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        (line,) = [x for x in done.stderr.splitlines() if x.startswith("tilestore: error: ")]
        assert f"{path}: embeddings/efficientnet-lite0/" in line, (name, line)
        assert (said_of_vectors if name == "export slides" else said) in line, (name, line)
    assert not (tmp_path / "slides.csv").exists() and not list((tmp_path / "h5").glob("*"))
    np.testing.assert_array_equal(vector[:], before)  # no vector written over it
