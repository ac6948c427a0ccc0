"""Our stores read by zarr-python with imagecodecs (and its imagecodecs-zarr codecs) in an
interpreter where tilestore is not installed: level 0 equal to tilestore's, pixel for pixel,
and the embeddings group (unfinished too) through plain zarr. imagecodecs ships its zarr v3
codecs for Python >= 3.12 only; the test finds such a Python (pyenv's, or python3.12/3.13 on
PATH), makes a virtual environment with those packages from the package index once per
session, and skips, saying why, where either cannot be had. bench/readers.py tries the other
readers (ome-zarr-py, napari-ome-zarr, tensorstore)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import warnings

import numpy as np
import pytest

from tests.conftest import CMU
from tilestore.errors import TilestoreWarning

pytestmark = pytest.mark.slow

PACKAGES = ["zarr>=3.1", "imagecodecs>=2026.4", "imagecodecs-zarr"]

READ = """
import sys, numpy as np, zarr, importlib.util
assert importlib.util.find_spec("tilestore") is None, "tilestore is importable here"
store, out = sys.argv[1:3]
root = zarr.open_group(store, mode="r")
level0 = np.moveaxis(root["0"][:], 0, -1)
features = zarr.open_group(store + "/embeddings/unfinished/1mpp-224px", mode="r")["features"][:]
np.savez(out, level0=level0, features=features)
"""


def _python312() -> str | None:
    """A Python >= 3.12 that runs (a pyenv shim on PATH may not, with no version set)."""
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[23]*/bin/python")))
    found += [shutil.which(f"python3.{minor}") for minor in (13, 12)]
    for python in filter(None, found):
        if subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0:
            return python
    return None


@pytest.fixture(scope="session")
def plain_python(tmp_path_factory) -> str:
    python = _python312()
    if python is None:
        pytest.skip("no Python >= 3.12 here (imagecodecs' zarr codecs need it)")
    venv = tmp_path_factory.mktemp("plain") / "venv"
    made = subprocess.run([python, "-m", "venv", str(venv)], capture_output=True, text=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *PACKAGES]
    if made.returncode or subprocess.run(pip, capture_output=True).returncode:
        pytest.skip(f"cannot install {' '.join(PACKAGES)} for {python} (no package index?)")
    return str(venv / "bin" / "python")


def test_zarr_with_imagecodecs_reads_our_store_without_tilestore(plain_python, stores, tmp_path):
    from tilestore.embeddings import EmbeddingWriter, RunIdentity
    from tilestore.plan import PlanOptions, plan_over_tissue, save_plan
    from tilestore.reading.opening import open_slide

    store = tmp_path / "cmu.ome.zarr"
    shutil.copytree(stores(CMU), store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TilestoreWarning)
        slide = open_slide(store)
    plan = plan_over_tissue(slide, PlanOptions(mpp=1.0, tile=224))
    uid = save_plan(slide, plan)
    identity = RunIdentity(
        {"name": "unfinished", "output_dim": 5},
        batch_size=4,
        dtype="float32",
        precision="fp32",
        compile=False,
        shard_tiles=8,
    )
    writer = EmbeddingWriter(slide, plan, uid, identity)
    values = np.arange(len(plan) * 5, dtype="float32").reshape(-1, 5)
    for block in (0, 1, 2):
        writer.write(block, values[block * 4 : block * 4 + 4])
    writer.abandon()  # unfinished: a run killed after three batches
    ours = slide.read_region(0, 0, slide.shape[2], slide.shape[1], level=0)
    out = tmp_path / "read.npz"
    run = subprocess.run(
        [plain_python, "-c", READ, str(store), str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not this checkout: no tilestore
    )
    assert run.returncode == 0, run.stderr[-2000:]
    read = np.load(out)
    level0 = read["level0"][: ours.shape[0], : ours.shape[1]]
    assert np.array_equal(level0, ours)  # the slide's JPEG tiles, decoded as tilestore does
    np.testing.assert_array_equal(read["features"][:12], values[:12])
    assert np.isnan(read["features"][12:]).all()
