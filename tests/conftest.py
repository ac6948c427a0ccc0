"""Shared fixtures: the real files in ../shared/data and stores converted from them once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tilestore.errors import TilestoreWarning

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("TILESTORE_DATA", REPO.parent / "shared" / "data"))
SLIDES = DATA / "slides"
ANNOTATIONS = DATA / "annotations"

CMU = "CMU-1-Small-Region.svs"
NDPI = "stritt_test3-DAPI-2-387.ndpi"
KIDNEY = "kidney-48-5.tif"
IHC = "skimage_ihc.png"
MONUSEG = "TCGA-A7-A13E-01Z-00-DX1"

pytest_plugins = ["tests.browser"]  # the `browser` fixture: headless Chromium


@pytest.fixture(autouse=True, scope="session")
def _shared_data_untouched():
    """Nothing a test does may write beside the real files (a sidecar, a store, a cache):
    the data folder is listed before the session and must be the same after it."""
    listing = lambda: sorted(str(p) for p in DATA.rglob("*")) if DATA.exists() else []  # noqa: E731
    before = listing()
    yield
    after = listing()
    assert after == before, f"tests wrote into {DATA}: {sorted(set(after) - set(before))}"


@pytest.fixture(autouse=True, scope="session")
def _own_compiler_caches(tmp_path_factory):
    """torch.compile's and Triton's caches in a folder of the test session's: what a run on
    this machine compiled before never decides what a test compiles, or how fast."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("compiler-caches")
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
        patch.setenv("TRITON_CACHE_DIR", str(folder / "triton"))
        yield


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """Batch-size memos and compiled graphs go to a folder of each test's own, never the
    user's cache (~/.cache/tilestore) nor one another test wrote: no test depends on the
    machine's past runs or on the order tests run in."""
    monkeypatch.setenv("TILESTORE_CACHE", str(tmp_path_factory.mktemp("tilestore-cache")))


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle",
        type=int,
        default=None,
        metavar="SEED",
        help="Run the tests in an order shuffled with this seed (order dependence shows).",
    )


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle")
    if seed is not None:
        import random

        random.Random(seed).shuffle(items)


def run_cli(*args, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """`tilestore ARGS` as a user runs it: a process of its own, its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "tilestore.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of its own (a node's small local disk), unmounted after the test."""
    folder = tmp_path / "local"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path, leave_kb: int) -> Path:
    """Fill the file system of `folder` but `leave_kb` KB."""
    free = shutil.disk_usage(folder).free // 1024
    filler = folder / "filler"
    filler.write_bytes(b"\0" * (max(0, free - leave_kb) * 1024))
    return filler


def real(path: Path) -> Path:
    """Return a file from ../shared/data, skipping the test if the data folder is absent."""
    if not path.exists():
        pytest.skip(f"real test data not found: {path} (set TILESTORE_DATA)")
    return path


@pytest.fixture(scope="session")
def slide_path():
    return lambda name: real(SLIDES / name)


@pytest.fixture(scope="session")
def annotation_path():
    return lambda name: real(ANNOTATIONS / name)


@pytest.fixture(scope="session")
def stores(tmp_path_factory):
    """Convert a real slide once per session; return its store path."""
    from tilestore.conversion.converter import convert

    made: dict[str, Path] = {}

    def get(name: str, **kwargs) -> Path:
        key = name + repr(sorted(kwargs.items()))
        if key not in made:
            src = real(SLIDES / name) if (SLIDES / name).exists() else real(ANNOTATIONS / name)
            out = tmp_path_factory.mktemp("stores")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TilestoreWarning)
                made[key] = convert(src, out, **kwargs).store
        return made[key]

    return get


@pytest.fixture
def store(tmp_path, stores):
    """A private copy of the converted CMU-1-Small-Region store."""

    def copy(name=CMU, into=None, **kwargs):
        target = (into or tmp_path) / f"{name}.ome.zarr"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(stores(name, **kwargs), target)
        return target

    return copy


@pytest.fixture(scope="session")
def cmu_pixels(slide_path) -> np.ndarray:
    """Level 0 of CMU-1-Small-Region as tifffile decodes it (H, W, 3)."""
    return tifffile.imread(slide_path(CMU))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


# Two classes drawn over CMU-1-Small-Region's tissue (level-0 px), for ROI-classed plans.
CMU_CLASSES = {
    "type": "FeatureCollection",
    "features": [
        {
            "type": "Feature",
            "geometry": {
                "type": "Polygon",
                "coordinates": [[[0, 0], [2220, 0], [2220, 1400], [0, 1400], [0, 0]]],
            },
            "properties": {"classification": {"name": "Stroma"}},
        },
        {
            "type": "Feature",
            "geometry": {
                "type": "Polygon",
                "coordinates": [[[0, 1400], [2220, 1400], [2220, 2967], [0, 2967], [0, 1400]]],
            },
            "properties": {"classification": {"name": "Tumor"}},
        },
    ],
}


@pytest.fixture(scope="session")
def embedded_cohort(tmp_path_factory, stores):
    """Real stores embedded once with efficientnet-lite0 on the CPU; returns their paths.

    CMU-1-Small-Region with an ROI plan of two classes, and the IHC PNG (mpp set to 0.5).
    """
    import json
    import shutil

    from tilestore.embed import Options, embed
    from tilestore.plan import PlanOptions, plan_over_tissue, save_plan
    from tilestore.reading.opening import open_slide

    root = tmp_path_factory.mktemp("cohort")
    cmu = root / "CMU-1-Small-Region.ome.zarr"
    ihc = root / "skimage_ihc.ome.zarr"
    shutil.copytree(stores(CMU), cmu)
    shutil.copytree(stores(IHC, mpp=0.5), ihc)
    roi = root / "classes.geojson"
    roi.write_text(json.dumps(CMU_CLASSES))
    slide = open_slide(cmu)
    save_plan(slide, plan_over_tissue(slide, PlanOptions(roi=roi, name="classes")))
    options = Options(batch_size=16, device="cpu", precision="fp32", dtype="float32")
    embed([cmu], "efficientnet-lite0", plan="classes", options=options)
    embed([ihc], "efficientnet-lite0", plan=PlanOptions(mpp=0.5, tile=224), options=options)
    return [cmu, ihc]


@pytest.fixture(scope="session")
def embedded_ds(embedded_cohort):
    """The embedded cohort opened as one Dataset."""
    import tilestore

    return tilestore.open_embeddings(embedded_cohort, "efficientnet-lite0")


def store_tree(root: Path, source_time: bool = True) -> dict[str, str]:
    """Each file's sha256 under root, the stores' `created` times blanked: stores compared
    bit for bit, whenever they were made. source_time=False blanks the source file's
    modification time too (a slide staged from a URL carries its object's, not the local
    copy's)."""
    import hashlib
    import json

    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            data = path.read_bytes()
            if name == "zarr.json":
                meta = json.loads(data)
                said = meta.get("attributes", {}).get("tilestore", {})
                said.pop("created", None)
                if not source_time:
                    said.get("source", {}).pop("mtime_ns", None)
                data = json.dumps(meta, sort_keys=True).encode()
            out[str(path.relative_to(root))] = hashlib.sha256(data).hexdigest()
    return out


def one_line_refusal(done: subprocess.CompletedProcess, *parts: str) -> None:
    """A command refused as the project refuses: exit 2, one line on stderr holding each of
    `parts`, no traceback."""
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def no_secret(secrets: list[str], outputs: list[str], folders: list[Path]) -> int:
    """No secret in any output, nor in any file under `folders` (reports, logs, every store
    file, the cache's records, its staged copies), read as bytes; the files looked at."""
    looked = 0
    for secret in secrets:
        assert secret and all(secret not in output for output in outputs), secret
    for folder in folders:
        for path in Path(folder).rglob("*"):
            if path.is_file():
                data, looked = path.read_bytes(), looked + 1
                for secret in secrets:
                    assert secret.encode() not in data, path
    return looked


def group_of(store, model: str, plan: str | None = None) -> str:
    """The path in `store` of `model`'s embeddings group (of `plan`; None: its only plan's),
    as the readers find it (`tilestore.embeddings.find_group`): embeddings/<model>/<plan>."""
    from tilestore.embeddings import find_group

    return find_group(store, model, plan)


@pytest.fixture(scope="module")
def s3():
    """A real S3 server (moto's, authentication on) for a module's tests, with an empty
    bucket (`tests.s3`)."""
    from tests.s3 import start_s3

    server = start_s3()
    yield server
    server.stop()
