"""Where outputs go is settled before the work: a missing folder is made, one that cannot be is
refused in one line before anything is computed; every export over a glob leaves out, with a
warning, the stores without what it exports; a plan asked for a filter is made with it or
refused, never made without it under the filter's name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import tilestore
from tests.conftest import run_cli as tilestore_cli
from tilestore.errors import PlanError
from tilestore.plan import PlanOptions
from tilestore.reading import open_slide


def test_a_preview_goes_into_a_new_folder_and_an_impossible_one_is_refused_first(store, tmp_path):
    path = store()
    made = tilestore_cli("plan", path, "--tile", "112", "--preview", tmp_path / "new" / "p.png")
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "new" / "p.png").stat().st_size > 0
    blocked = tmp_path / "file"
    blocked.write_text("a file where a folder would go")
    refused = tilestore_cli("plan", path, "--tile", "96", "--preview", blocked / "p.png")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"tilestore: error: {blocked / 'p.png'}: cannot make the folder {blocked} (File exists)"
    ]
    assert not (path / "plans" / "0.5mpp-96px").exists(), "planned before the refusal"


def test_export_h5_over_a_glob_leaves_out_the_stores_without_embeddings(
    embedded_cohort, store, tmp_path
):
    import shutil

    cohort = tmp_path / "cohort"
    for path in embedded_cohort:
        shutil.copytree(path, cohort / path.name)
    bare = store(into=cohort)  # a store the run has not reached yet
    target = tmp_path / "h5"
    glob = tilestore_cli(
        "export", "h5", cohort / "*.ome.zarr", "-m", "efficientnet-lite0", "-o", target
    )
    assert glob.returncode == 0, glob.stderr
    assert "skipped" in glob.stderr and str(bare) in glob.stderr
    assert sorted(p.name for p in target.iterdir()) == [
        "CMU-1-Small-Region.h5",
        "skimage_ihc.h5",
    ]
    named = tilestore_cli("export", "h5", bare, "-m", "efficientnet-lite0", "-o", tmp_path / "x")
    assert named.returncode == 2 and "no embeddings/efficientnet-lite0" in named.stderr
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


def test_export_slides_into_a_new_folder(embedded_cohort, tmp_path):
    from tilestore.embed.slides import embed_slides

    # copies: the session's embedded stores are every test's, and stay as they were made
    stores = [shutil.copytree(p, tmp_path / "stores" / p.name) for p in embedded_cohort]
    embed_slides(stores, "mean", model="efficientnet-lite0", device="cpu")
    target = tmp_path / "deep" / "er" / "slides.parquet"
    run = tilestore_cli("export", "slides", *stores, "-m", "efficientnet-lite0",
                        "-s", "mean", "-o", target)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert target.stat().st_size > 0


def test_a_plan_asked_for_max_blur_is_filtered_or_refused_never_named_so_unfiltered(store):
    slide = open_slide(store())
    with pytest.raises(
        PlanError,
        match=r"max_blur=0.5: the blur filter reads .*plan with tilestore.plan_slide, not ",
    ):
        from tilestore.plan import plan_over_tissue

        plan_over_tissue(slide, PlanOptions(max_blur=0.5))
    with pytest.raises(
        PlanError, match=r"max_blur needs per-tile measures from an embedding pass; none in this"
    ):
        tilestore.plan_slide(slide, PlanOptions(max_blur=0.5))
    assert tilestore.plan_slide is tilestore.embeddings.plan_slide


WRITTEN_FLAGS = [  # every flag naming a path a command writes, each given a bucket's URL
    # (but convert's -o: a store is uploaded there, tests/test_bucket_stores.py)
    ("tissue", "{store}", "--preview", "s3://bucket/mask.png"),
    ("plan", "{store}", "--preview", "gs://bucket/plan.png"),
    ("qc", "{store}", "--report", "s3://bucket/qc"),
    ("embed", "{slide}", "--into", "s3://bucket/stores"),
    ("embed", "{store}", "--report", "https://example.org/report.json"),
    ("embed", "{slide}", "--in-place", "--sidecars", "s3://bucket/sidecars"),
    ("export", "h5", "{store}", "-m", "efficientnet-lite0", "-o", "s3://bucket/h5"),
    ("crossval", "{slide}", "{store}", "--out", "s3://bucket/run"),
]


@pytest.mark.parametrize("args", WRITTEN_FLAGS, ids=lambda a: f"{a[0]} {a[-2]}")
def test_a_path_to_write_given_as_a_url_is_refused_never_a_local_folder(
    args, store, tmp_path, monkeypatch
):
    """A store, folder or file to write named by URL is refused in one line, exit 2, before
    any work: a Path folds s3://bucket/x into a local folder "s3:/bucket/x", which the
    command would fill and end with exit 0 (what `convert -o s3://...` did)."""
    from tests.conftest import SLIDES

    given = {"slide": SLIDES / "CMU-1-Small-Region.svs", "store": store()}
    work = tmp_path / "work"
    work.mkdir()
    line = [a.format(**given) for a in args]
    if args[0] == "embed":
        line += ["--model", "efficientnet-lite0"]
    done = tilestore_cli(*line, cwd=work)
    flag, url = {"-o": "output"}.get(args[-2], args[-2]).lstrip("-"), args[-1]
    assert done.returncode == 2, done.stderr
    (said,) = done.stderr.strip().splitlines()
    assert said == (
        f"tilestore: error: --{flag} {url}: a URL; tilestore writes to a local or mounted file "
        "system, not to object storage: write it here, then copy it there (aws s3 sync, gcloud "
        "storage rsync)"
    )
    assert not any(work.iterdir()), "something was written here"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://example.org/stores", "https:// URLs are read, never written"),
        ("dicomweb+https://pacs.org/dicom-web", "dicomweb+https:// URLs are read, never written"),
    ],
)
def test_convert_refuses_an_output_it_cannot_upload_to_before_any_work(url, why, tmp_path):
    """convert's -o takes a bucket's URL (built here, then uploaded); a URL of a server
    that is only read is refused in one line, and nothing is written here."""
    from tests.conftest import SLIDES

    work = tmp_path / "work"
    work.mkdir()
    done = tilestore_cli("convert", SLIDES / "CMU-1-Small-Region.svs", "-o", url, cwd=work)
    assert done.returncode == 2, done.stderr
    (said,) = done.stderr.strip().splitlines()
    assert said.startswith(f"tilestore: error: --output {url}: {why}"), said
    assert not any(work.iterdir()), "something was written here"


@pytest.mark.parametrize("url", ["s3://bucket/x.ome.zarr", "gs://b/x", "https://h.org/x"])
def test_the_library_refuses_a_url_to_write_before_any_work(url, tmp_path, monkeypatch):
    """The library refuses alike (`convert`'s dst, embed's into and sidecars, an export's
    declared output), naming the argument; a local path and file:// pass."""
    from tests.conftest import SLIDES
    from tilestore.embed import embed
    from tilestore.embed.inputs import Preparation
    from tilestore.embed.slides import embed_patients
    from tilestore.errors import OutputError
    from tilestore.options import Kind, Opt, check
    from tilestore.urls import written_here

    monkeypatch.chdir(tmp_path)
    if url.startswith("https"):  # a bucket's: uploaded there (tests/test_bucket_stores.py)
        with pytest.raises(OutputError, match=r"^dst .*: https:// URLs are read, never"):
            tilestore.convert(SLIDES / "CMU-1-Small-Region.svs", url)
    with pytest.raises(OutputError, match=r"^into .*: a URL"):
        Preparation.of(url, None)
    with pytest.raises(OutputError, match=r"^sidecars .*: a URL"):
        Preparation.of(None, None, in_place=True, sidecars=url)
    with pytest.raises(OutputError, match=r"^output= .*: a URL"):
        check("output", url, Kind(path=True), Opt("A file.", writes="file"))
    with pytest.raises(OutputError, match=r"^report_path .*: a URL"):  # before the model
        embed([tmp_path / "x.ome.zarr"], "efficientnet-lite0", report_path=url)
    with pytest.raises(OutputError, match=r"^output .*: a URL"):
        embed_patients([], tmp_path / "t.csv", url)
    assert not any(tmp_path.iterdir())
    declared = Opt("A file.", writes="file")
    assert check("output", "file:///tmp/x.h5", Kind(path=True), declared) == Path("/tmp/x.h5")
    assert written_here("a/b.ome.zarr", "dst") == Path("a/b.ome.zarr")
    assert written_here("file:///tmp/x", "dst") == Path("/tmp/x")
