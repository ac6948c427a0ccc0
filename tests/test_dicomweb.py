"""A DICOM WSI series on a real DICOMweb server (Orthanc with its DICOMweb plugin,
authentication on): listed by QIDO-RS, its instances fetched whole by WADO-RS, staged and
converted into the store the same files make from a local folder; refused in one line where
it cannot be read; its password in no output."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import SLIDES, no_secret, one_line_refusal, run_cli, store_tree
from tests.dicomweb import PASSWORD, start_orthanc

CAMELYON = SLIDES / "camelyon_lymphnode_jpeg.dcm"


@pytest.fixture(scope="module")
def orthanc(tmp_path_factory):
    server = start_orthanc(tmp_path_factory.mktemp("orthanc"))
    study, series = server.upload(CAMELYON)
    yield server, study, series
    server.stop()


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
    assert store_tree(tmp_path / "r" / name, False) == store_tree(tmp_path / "l" / name, False)
    staged = next((tmp_path / "cache" / "slides" / "dicomweb").rglob("*.dcm"))
    assert staged.read_bytes() == CAMELYON.read_bytes()  # the stored file, as the server keeps it
    again = run_cli("convert", url, "-o", tmp_path / "again", env=env)
    assert again.returncode == 0 and staged.exists()
    for output in (done.stdout + done.stderr, again.stdout + again.stderr):
        assert PASSWORD not in output
    assert PASSWORD not in "".join(p.read_text() for p in (tmp_path / "cache").rglob("*.json"))


def test_a_wrong_password_or_a_missing_series_is_said_inone_line_refusal(orthanc, tmp_path):
    server, study, series = orthanc
    env = {**__import__("os").environ, "TILESTORE_CACHE": str(tmp_path / "cache")}
    wrong = run_cli("convert", server.series_url(study, series, password="nope-x"), "-o",
                    tmp_path / "o", env=env)  # fmt: skip
    one_line_refusal(
        wrong, f"127.0.0.1:{server.port}/dicom-web/studies/{study}", "access refused (401)"
    )
    assert "nope-x" not in wrong.stderr and PASSWORD not in wrong.stderr
    missing = run_cli("convert", server.series_url(study, "1.2.3.4"), "-o", tmp_path / "o", env=env)
    one_line_refusal(missing, "series/1.2.3.4", "not found")
    malformed = run_cli("convert", f"dicomweb+http://127.0.0.1:{server.port}/dicom-web/x.dcm",
                        "-o", tmp_path / "o", env=env)  # fmt: skip
    one_line_refusal(malformed, "a DICOMweb series is named")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_embed_from_dicomweb_gives_the_features_of_the_local_series(orthanc, tmp_path):
    """`tilestore embed dicomweb+... --into DIR`: staged, converted, embedded; the features
    bit for bit those of the same files in a local folder."""
    import os

    import numpy as np
    import zarr

    from tests.conftest import group_of

    server, study, series = orthanc
    folder = tmp_path / "local" / series
    folder.mkdir(parents=True)
    shutil.copy(CAMELYON, folder / CAMELYON.name)
    # the slide's own 28.97 um/px: a lymph node scanned coarse
    flags = ("--model", "efficientnet-lite0", "--device", "cpu", "--mpp", "30", "--max-tiles", "8")
    env = {**os.environ, "TILESTORE_CACHE": str(tmp_path / "cache")}
    there = run_cli("embed", server.series_url(study, series), "--into", tmp_path / "r", *flags,
                    "--report", tmp_path / "report" / "run.json", env=env)  # fmt: skip
    assert there.returncode == 0, there.stdout + there.stderr
    here = run_cli("embed", folder, "--into", tmp_path / "l", *flags)
    assert here.returncode == 0, here.stdout + here.stderr
    found = []
    for side in ("r", "l"):
        store = tmp_path / side / f"{series}.ome.zarr"
        group = zarr.open_group(store / group_of(store, "efficientnet-lite0"), mode="r")
        found.append(group["features"][:])
    assert found[0].shape[0] > 0 and np.array_equal(*found, equal_nan=True)
    # the password nowhere: not said, nor in the report, the store or the cache's records
    outputs = [there.stdout + there.stderr]
    folders = [tmp_path / "report", tmp_path / "r", tmp_path / "cache"]
    assert no_secret([PASSWORD], outputs, folders) > 20


def test_a_dicom_folder_is_named_alike_by_convert_and_embed(tmp_path):
    """A folder named by its series UID: `embed --into` put its store under the name less
    what followed the UID's last dot (a suffix to Path.stem), `convert` under the whole
    name, so neither found the other's store. One name now, the folder's whole."""
    from tilestore.conversion import converted_store
    from tilestore.embed.inputs import Preparation
    from tilestore.format import store_name

    folder = tmp_path / "1.2.840.1.5.1688792467737634"
    folder.mkdir()
    want = tmp_path / "out" / "1.2.840.1.5.1688792467737634.ome.zarr"
    assert converted_store(folder, tmp_path / "out") == want
    assert Preparation.of(tmp_path / "out", None).target(folder) == want
    assert store_name(folder) == want.name
    assert (
        store_name("dicomweb+https://h/dw/studies/1.2/series/1.2.840.1.5") == "1.2.840.1.5.ome.zarr"
    )
