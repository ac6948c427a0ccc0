"""kill -9 anywhere, then the same command again: the same store or embeddings as a run that was
never killed, and nothing left behind (no partial folder, no lock)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import timm
import zarr

from tests.conftest import CMU, group_of
from tilestore.embed import Options, embed
from tilestore.embeddings import group_name
from tilestore.errors import TilestoreWarning
from tilestore.plan import PlanOptions

CONVERT = """
import sys, warnings
from tilestore.conversion.converter import convert
warnings.simplefilter("ignore")
convert(sys.argv[1], sys.argv[2], copy=False, workers=1, overwrite=True, shard=2)
"""

EMBED = """
import sys
from tilestore.embed import Options, embed
from tilestore import PlanOptions
embed([sys.argv[1]], sys.argv[2], plan=PlanOptions(mpp=0.5, tile=224),
      options=Options(batch_size=2, device="cpu", precision="fp32", dtype="float32",
                      shard_tiles=6))
"""
# features in shards of 3 batches (8 shards): a shard rewritten whole as its batches come in
OPTIONS = Options(batch_size=2, device="cpu", precision="fp32", dtype="float32", shard_tiles=6)


def _start(code: str, *args) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env)


def _kill_when(process: subprocess.Popen, reached, timeout: float = 300) -> None:
    """SIGKILL the process once reached() is true (or once it has ended by itself)."""
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        if reached():
            break
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()


def _files(store: Path) -> dict[str, bytes]:
    """Every file of a store by path, the root's creation time left out."""
    files = {}
    for path in sorted(store.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "zarr.json":
                doc = json.loads(data)
                doc.get("attributes", {}).get("tilestore", {}).pop("created", None)
                doc.pop("consolidated_metadata", None)
                data = json.dumps(doc, sort_keys=True).encode()
            files[str(path.relative_to(store))] = data
    return files


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# shards of 2 x 2 chunks written (of 43: 30, 9 and 4 per level) when the conversion is
# killed: small shards, so that a small slide is many shards, each written whole and renamed
CONVERT_POINTS = [1, 4, 9, 14, 19, 25, 30, 35, 39, 42]


@pytest.fixture(scope="module")
def converted(tmp_path_factory, slide_path):
    """The store of a conversion never killed."""
    out = tmp_path_factory.mktemp("reference")
    subprocess.run([sys.executable, "-c", CONVERT, slide_path(CMU), out], check=True)
    return _files(out / "CMU-1-Small-Region.ome.zarr")


@pytest.mark.slow
@pytest.mark.parametrize("written", CONVERT_POINTS)
def test_a_killed_conversion_reruns_to_the_same_store(tmp_path, slide_path, converted, written):
    out = tmp_path / "out"
    out.mkdir()
    if written % 2:  # an old store is being replaced: the kill must not lose it
        subprocess.run([sys.executable, "-c", CONVERT, slide_path(CMU), out], check=True)

    def reached() -> bool:
        try:  # shards renamed into place (not zarr's temporary *.partial files)
            done = [p for p in out.glob(".*.partial*/*/c/**/*") if p.suffix != ".partial"]
            return sum(1 for p in done if p.is_file()) >= written
        except FileNotFoundError:  # the partial folder renamed into place meanwhile: done
            return True

    _kill_when(_start(CONVERT, slide_path(CMU), out), reached)
    store = out / "CMU-1-Small-Region.ome.zarr"
    if written % 2:
        assert store.exists() or list(out.glob(".*.replaced.*"))  # never lost
    subprocess.run([sys.executable, "-c", CONVERT, slide_path(CMU), out], check=True)
    assert _files(store) == converted
    assert _leftovers(out) == []


# batches done (of 23; a shard's 3 at a time) when the embedding is killed; 0: the group
# made, nothing written
EMBED_POINTS = [0, 1, 2, 4, 7, 10, 13, 16, 19, 22]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A small ViT with fixed weights, as a local checkpoint: every process loads the same."""
    folder = tmp_path_factory.mktemp("model")
    net = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, depth=2)
    state = {k: v.contiguous() for k, v in net.state_dict().items()}
    safetensors.torch.save_file(state, folder / "model.safetensors")
    config = {"architecture": "vit_tiny_patch16_224", "model_args": {"depth": 2}}
    (folder / "config.json").write_text(json.dumps(config))
    return f"local:{folder}"


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, stores, model):
    """Features of an embedding never killed."""
    import shutil

    store = tmp_path_factory.mktemp("uninterrupted") / "cmu.ome.zarr"
    shutil.copytree(stores(CMU), store)
    subprocess.run([sys.executable, "-c", EMBED, store, model], check=True)
    return _features(store, model)


def _features(store: Path, model: str) -> np.ndarray:
    group = zarr.open_group(store / group_of(store, model))
    assert group.attrs["tilestore"]["complete"]
    assert group["features"].shards[0] == 6  # 3 batches of 2 to a shard
    return group["features"][:]


@pytest.mark.slow
@pytest.mark.parametrize("written", EMBED_POINTS)
def test_a_killed_embedding_reruns_to_the_same_features(tmp_path, stores, model, embedded, written):
    import shutil

    store = tmp_path / "cmu.ome.zarr"
    shutil.copytree(stores(CMU), store)
    group = store / group_name(model, "0.5mpp-224px")  # embeddings/<model>/<plan>, as it will be

    def reached() -> bool:
        if written == 0:
            return group.exists()
        try:
            return int(zarr.open_array(group / "done", mode="r")[:].sum()) >= written
        except (FileNotFoundError, KeyError, ValueError):
            return False

    _kill_when(_start(EMBED, store, model), reached)
    with warnings.catch_warnings():  # the same call again, in this process
        warnings.simplefilter("ignore", TilestoreWarning)
        report = embed([store], model, plan=PlanOptions(mpp=0.5, tile=224), options=OPTIONS)
    assert not report.failures
    assert np.array_equal(_features(store, model), embedded)  # bitwise, fp32
    assert _leftovers(tmp_path) == []  # no lock file
    assert list(group.rglob("*.partial")) == []  # nor a shard the killed run was writing
