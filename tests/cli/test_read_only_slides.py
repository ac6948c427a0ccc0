"""Slides in a read-only archive: sizing them for `--shard` writes nothing beside them, and
`--in-place --sidecars DIR` embeds them with every sidecar in DIR. (Tests run as root here,
where a read-only mode does not stop writes: the archive's listing and times are compared
instead, and the modes are set anyway, as a cluster's archive would have them.)"""

from __future__ import annotations

import shutil
import stat

import pytest

from tests.cli.test_cli import tilestore
from tests.conftest import CMU

SHARE = ("--model", "efficientnet-lite0", "--device", "cpu", "--mpp", "1", "--batch-size", "8")


def _listing(folder):
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


def test_a_sharded_run_over_a_read_only_archive_writes_only_where_asked(tmp_path, slide_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    slides = [archive / f"{name}.svs" for name in ("a", "b", "c")]
    for path in slides:
        shutil.copyfile(slide_path(CMU), path)
        path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    archive.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    before = _listing(archive)
    try:
        dry = tilestore("embed", *slides, *SHARE, "--shard", "0/2", "--in-place", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        said = " ".join(dry.stdout.split())  # the table folds long notes
        assert "shard 0/2: 2 store(s)" in said and said.count("a slide: would be read") == 2
        assert _listing(archive) == before  # sized and planned without a sidecar

        sidecars = tmp_path / "sidecars"
        done = []
        for k in (0, 1):
            run = tilestore(
                "embed", *slides, *SHARE, "--shard", f"{k}/2", "--in-place", "--sidecars", sidecars
            )
            assert run.returncode == 0, run.stderr
            done += [line for line in run.stdout.splitlines() if "tiles in" in line]
        assert _listing(archive) == before  # nothing beside the slides, ever
        made = sorted(p.name for p in sidecars.iterdir() if not p.name.startswith("."))
        assert made == [f"{s.name}.tilestore.zarr" for s in slides]  # each once, in one share
        for path in slides:
            assert (sidecars / f"{path.name}.tilestore.zarr" / "embeddings").is_dir()
    finally:
        archive.chmod(stat.S_IRWXU)


def test_sidecars_without_in_place_is_one_line(tmp_path, slide_path):
    run = tilestore("embed", slide_path(CMU), *SHARE, "--sidecars", tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "tilestore: error: --sidecars is where --in-place keeps its sidecars: add --in-place"
    )


def test_models_profile_runs_without_cuda():
    """`auto` is the library's to resolve: on a machine without CUDA it is the CPU, fp32."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: auto would pick it")
    run = tilestore("models", "profile", "efficientnet-lite0", "--batches", "2,4", "--repeats", "1")
    assert run.returncode == 0, run.stderr
    assert "efficientnet-lite0 on cpu, fp32" in run.stdout
    rows = [line.split() for line in run.stdout.splitlines() if line.split()[:1] in (["2"], ["4"])]
    # each size measured and its rate said; the rate itself is the machine's load (a busy
    # 2-core machine printed 0 tiles/s), not the code's, so it is not judged
    assert [r[0] for r in rows] == ["2", "4"] and all(
        float(r[1].replace(",", "")) >= 0 for r in rows
    )
