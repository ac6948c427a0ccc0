"""A DICOM WSI series on a real DICOMweb server (Orthanc with its DICOMweb plugin,
authentication on): listed by QIDO-RS, its instances fetched whole by WADO-RS, staged and
converted into the store the same files make from a local folder; refused in one line where
it cannot be read; its password in no output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import SLIDES, run_cli, store_tree
from tests.dicomweb import PASSWORD, start_orthanc

CAMELYON = SLIDES / "camelyon_lymphnode_jpeg.dcm"


@pytest.fixture(scope="module")
def orthanc(tmp_path_factory):
    server = start_orthanc(tmp_path_factory.mktemp("orthanc"))
    study, series = server.upload(CAMELYON)
    yield server, study, series
    server.stop()


def _tree(store: Path) -> dict[str, str]:
    tree = store_tree(store)
    meta = json.loads((store / "zarr.json").read_text())
    del tree["zarr.json"]  # the source's time: the staged files', not the local copy's
    return {**tree, "record": json.dumps({k: v for k, v in meta["attributes"]["tilestore"][
        "source"].items() if k != "mtime_ns"}, sort_keys=True)}  # fmt: skip


def _one_line(done, *parts: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def test_a_series_from_dicomweb_makes_the_store_its_local_files_make(orthanc, tmp_path):
    server, study, series = orthanc
    folder = tmp_path / "local" / series  # a local folder of the series, named by it
    folder.mkdir(parents=True)
    shutil.copy(CAMELYON, folder / CAMELYON.name)
    local = run_cli("convert", folder, "-o", tmp_path / "l")
    assert local.returncode == 0, local.stderr
    env = {**__import__("os").environ, "TILESTORE_CACHE": str(tmp_path / "cache")}
    url = server.series_url(study, series)
    done = run_cli("convert", url, "-o", tmp_path / "r", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    name = f"{series}.ome.zarr"
    assert _tree(tmp_path / "r" / name) == _tree(tmp_path / "l" / name)
    staged = next((tmp_path / "cache" / "slides" / "dicomweb").rglob("*.dcm"))
    assert staged.read_bytes() == CAMELYON.read_bytes()  # the stored file, as the server keeps it
    again = run_cli("convert", url, "-o", tmp_path / "again", env=env)
    assert again.returncode == 0 and staged.exists()
    for output in (done.stdout + done.stderr, again.stdout + again.stderr):
        assert PASSWORD not in output
    assert PASSWORD not in "".join(p.read_text() for p in (tmp_path / "cache").rglob("*.json"))


def test_a_wrong_password_or_a_missing_series_is_said_in_one_line(orthanc, tmp_path):
    server, study, series = orthanc
    env = {**__import__("os").environ, "TILESTORE_CACHE": str(tmp_path / "cache")}
    wrong = run_cli("convert", server.series_url(study, series, password="nope-x"), "-o",
                    tmp_path / "o", env=env)  # fmt: skip
    _one_line(wrong, f"127.0.0.1:{server.port}/dicom-web/studies/{study}", "access refused (401)")
    assert "nope-x" not in wrong.stderr and PASSWORD not in wrong.stderr
    missing = run_cli("convert", server.series_url(study, "1.2.3.4"), "-o", tmp_path / "o", env=env)
    _one_line(missing, "series/1.2.3.4", "not found")
    malformed = run_cli("convert", f"dicomweb+http://127.0.0.1:{server.port}/dicom-web/x.dcm",
                        "-o", tmp_path / "o", env=env)  # fmt: skip
    _one_line(malformed, "a DICOMweb series is named")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
