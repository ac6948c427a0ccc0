"""`tilestore view` as a person runs it: a URL to open, a taken port in one line, Ctrl-C
that stops it cleanly, and a slide file read in place with nothing left behind."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import CMU


@contextlib.contextmanager
def running(*args, env=None):
    """`tilestore view ARGS --port 0` started; yields (url, process); Ctrl-C at the end."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tilestore.cli", "view", *map(str, args), "--port", "auto"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    seen, deadline = "", time.monotonic() + 120
    try:
        while "Ctrl-C stops" not in seen:
            line = process.stdout.readline()
            if not line:
                pytest.fail(f"view ended: {process.stderr.read()}")
            seen += line
            assert time.monotonic() < deadline, seen
        url = re.search(r"http://127\.0\.0\.1:\d+/", seen).group(0)
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                raise


def get(url: str) -> tuple[int, bytes, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read(), response.headers["Content-Type"]


def test_view_prints_its_url_serves_and_stops_on_ctrl_c(stores):
    with running(stores(CMU)) as (url, process):
        status, body, kind = get(url + "api/slides")
        assert status == 200 and b"CMU-1-Small-Region" in body and kind == "application/json"
        status, body, kind = get(url + "tiles/0/0/0/0")
        assert status == 200 and body[:2] == b"\xff\xd8" and kind == "image/jpeg"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        assert "tilestore view: stopped" in process.stdout.read()
        assert "Traceback" not in process.stderr.read()


def test_a_port_in_use_is_one_line_and_exit_2(stores):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        run = subprocess.run(
            [sys.executable, "-m", "tilestore.cli", "view", str(stores(CMU)), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        taken.close()
    assert run.returncode == 2
    assert run.stderr.strip() == (
        f"tilestore: error: port {port} on 127.0.0.1 is in use; choose another port"
    )


def test_a_slide_file_is_read_in_place_and_nothing_is_left_behind(slide_path, tmp_path):
    slide = slide_path(CMU)
    beside = sorted(slide.parent.iterdir())
    with running(slide, env={"TMPDIR": str(tmp_path)}) as (url, process):
        assert list(tmp_path.glob("tilestore-view-*/*.tilestore.zarr"))  # its sidecar
        status, _, kind = get(url + "tiles/0/0/1/1")
        assert status == 200 and kind == "image/jpeg"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    assert sorted(slide.parent.iterdir()) == beside
    assert not list(tmp_path.glob("tilestore-view-*"))


def test_a_missing_store_is_one_line(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "tilestore.cli", "view", str(tmp_path / "nope.ome.zarr")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert run.stderr.startswith("tilestore: error: ") and "nope.ome.zarr" in run.stderr


def test_export_heatmap_writes_what_it_is_asked_for(embedded_cohort, tmp_path):
    store = shutil.copytree(embedded_cohort[0], tmp_path / embedded_cohort[0].name)
    command = [sys.executable, "-m", "tilestore.cli", "export", "heatmap", str(store), "-m",
               "efficientnet-lite0"]  # fmt: skip
    run = subprocess.run(
        [*command, "--column", "similarity", "--at", "1000,1300", "--png", str(tmp_path / "s.png"),
         "--label"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "s.png").stat().st_size > 10_000
    assert any(p.name.startswith("heatmap-") for p in (store / "labels").iterdir())
    nothing = subprocess.run([*command, "--column", "tissue"], capture_output=True, text=True)
    assert (
        nothing.returncode == 2
        and "give at least one of --png <file>, --geojson <file>, --label" in (nothing.stderr)
    )
    unknown = subprocess.run(
        [*command, "--column", "nope", "--png", str(tmp_path / "n.png")], capture_output=True,
        text=True,
    )  # fmt: skip
    assert unknown.returncode == 2 and unknown.stderr.startswith("tilestore: error: ")
    assert "no per-tile column 'nope'" in unknown.stderr and not (tmp_path / "n.png").exists()


def test_a_slide_without_pixel_size_is_told_the_flag_view_takes(slide_path, tmp_path):
    """View read a slide without a pixel size and said "set it with --mpp", a flag it has
    not: its note names its own --scan-mpp, which it takes."""
    import tifffile

    src = tmp_path / "stripped.tif"  # CMU's pixels, no resolution recorded anywhere
    tifffile.imwrite(src, tifffile.imread(slide_path(CMU)), tile=(240, 240), compression="jpeg")
    with running(src, env={"TMPDIR": str(tmp_path)}) as (_, process):
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        said = process.stderr.read()
    assert "(set it with --scan-mpp <um/px>)" in said and "--mpp <" not in said
    with running(src, "--scan-mpp", "0.499", env={"TMPDIR": str(tmp_path)}) as (url, process):
        status, body, _ = get(url + "api/slides")
        assert status == 200 and b"0.499" in body


def test_a_scan_mpp_against_the_files_is_one_line_in_views_flags(slide_path):
    run = subprocess.run(
        [sys.executable, "-m", "tilestore.cli", "view", str(slide_path(CMU)), "--scan-mpp",
         "0.25"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "the file states 0.499 um/px" in run.stderr and "(--scan-mpp 0.25)" in run.stderr
    assert "--override-mpp" in run.stderr
