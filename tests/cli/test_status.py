"""`tilestore status` over a cohort and `tilestore info`'s embeddings: the rows, the sum, the
exit codes (0 all complete, 1 work left, 2 bad input or a damaged store) and the command
printed, which, run as printed, finishes the cohort."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import zarr

from tests.cli.test_cli import tilestore
from tests.conftest import IHC, group_of, real
from tests.tilestore.test_embeddings_status import LITE, interrupt
from tilestore.embeddings.write import write_features

RUN = "--batch-size 16 --dtype float32 --precision fp32"  # what embedded_cohort's runs record


def _cohort(embedded_cohort, stores, folder: Path) -> list[Path]:
    """complete (a), interrupted (b), not embedded (skimage_ihc: its store as converted)."""
    folder.mkdir()
    done, half = folder / "a.ome.zarr", folder / "b.ome.zarr"
    shutil.copytree(embedded_cohort[0], done)
    shutil.copytree(embedded_cohort[0], half)
    interrupt(half)
    bare = folder / "skimage_ihc.ome.zarr"
    shutil.copytree(stores(IHC, mpp=0.5), bare)
    return [done, half, bare]


def test_status_rows_sum_and_the_printed_commands_finish_the_cohort(
    embedded_cohort, stores, tmp_path
):
    done, half, bare = _cohort(embedded_cohort, stores, tmp_path / "cohort")
    run = tilestore("status", done, half, bare, "--model", LITE)
    assert run.returncode == 1, run.stderr
    rows = [line.split(None, 3)[:3] for line in run.stdout.splitlines()[1:4]]  # never folded
    assert rows == [
        [str(done), "classes", "complete"],
        [str(half), "classes", "partial"],
        [str(bare), "-", "not"],
    ]
    assert "3 stores: 1 complete, 1 partial, 0 running, 0 damaged, 0 other plan, 1 not started" in (
        run.stdout
    )
    commands = [line.strip() for line in run.stdout.splitlines() if line.startswith("  ")]
    assert commands == [
        f"tilestore embed {half} --model {LITE} {RUN} --plan classes",
        f"tilestore embed {bare} --model {LITE} --dtype float32 --precision fp32",
    ]
    as_json = json.loads(tilestore("status", done, half, bare, "--model", LITE, "--json").stdout)
    assert as_json["commands"] == commands and as_json["left"] == [str(half), str(bare)]
    states = [(row["store"], row["state"], row["left"]) for row in as_json["stores"]]
    assert states == [
        (str(done), "complete", False),
        (str(half), "partial", True),
        (str(bare), "not started", True),
    ]
    for command in commands:  # as a user pastes it (this interpreter's `tilestore`)
        line = command.replace("tilestore", f"{sys.executable} -m tilestore.cli", 1)
        ran = subprocess.run(line + " --device cpu", shell=True, capture_output=True, text=True,
                             timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
        assert ran.returncode == 0, ran.stderr
    after = tilestore("status", done, half, bare, "--model", LITE)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "3 stores: 3 complete," in after.stdout and "to finish" not in after.stdout


def test_the_stores_left_go_to_a_file_the_command_reads(embedded_cohort, stores, tmp_path):
    done, half, _ = _cohort(embedded_cohort, stores, tmp_path / "cohort")
    todo = tmp_path / "lists" / "left.txt"
    run = tilestore("status", done, half, "--todo", todo)  # the model: the stores' only one
    assert run.returncode == 1, run.stderr
    assert todo.read_text() == f"{half}\n"
    assert f"tilestore embed $(cat {todo}) --model {LITE} {RUN} --plan classes" in run.stdout


def test_a_damaged_store_or_another_plan_exits_2(embedded_cohort, stores, tmp_path):
    done, half, _ = _cohort(embedded_cohort, stores, tmp_path / "cohort")
    meta = half / group_of(half, LITE) / "zarr.json"
    meta.write_text("{ not json")
    run = tilestore("status", done, half, "--model", LITE)
    assert run.returncode == 2 and "1 damaged" in run.stdout and "damaged" in run.stdout
    # another plan's group would be made beside this one: not started, work left (exit 1)
    other = tilestore("status", done, "--model", LITE, "--plan", "other")
    assert other.returncode == 1 and "1 not started" in other.stdout
    assert f"--model {LITE}" in other.stdout and "--plan other" in other.stdout
    # the plan the embeddings came from replaced (issue 69: "complete 4/4", exit 0): other plan
    made = tilestore("plan", done, "--mpp", "0.5", "--tile", "224", "--stride", "112",
                     "--name", "classes", "--overwrite")  # fmt: skip
    assert made.returncode == 0, made.stderr
    for asked in ([], ["--plan", "classes"]):
        again = tilestore("status", done, "--model", LITE, *asked)
        assert again.returncode == 2 and "1 other plan" in again.stdout, again.stdout
        assert "made from an earlier plan 'classes'" in again.stdout
        assert "stored again since" in again.stdout and "pass --overwrite to embed" in again.stdout


def test_bad_input_is_one_line_and_exit_2(embedded_cohort, stores, tmp_path):
    done, half, bare = _cohort(embedded_cohort, stores, tmp_path / "cohort")
    run = tilestore("status", done, tmp_path / "nope.ome.zarr", "--model", LITE)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"tilestore: error: {tmp_path / 'nope.ome.zarr'}: not a store (no zarr.json); give "
        "stores made by `tilestore convert`"
    ]
    tiles = zarr.open_group(done / group_of(done, LITE), mode="r")["x"].shape[0]
    write_features(half, {"name": "other"}, np.ones((tiles, 4), np.float32), plan="classes")
    mixed = tilestore("status", done, half, bare)
    assert mixed.returncode == 2
    assert mixed.stderr.strip().splitlines() == [
        f"tilestore: error: which model? embeddings found: {LITE} (2 stores), other (1 store); "
        "1 of 3 stores hold none; name one with --model <name>"
    ]


def test_status_without_model_picks_the_one_model_or_asks(embedded_cohort, stores, tmp_path):
    """Issue 63: `status stores/*` exited 2 (a damaged store's code) for a store without
    any embeddings group: it is one not started (work left, exit 1)."""
    done, half, bare = _cohort(embedded_cohort, stores, tmp_path / "cohort")
    run = tilestore("status", done, half, bare)
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines() == [
        f"model: {LITE} (the stores' only one; --model to ask for another)"
    ]
    assert "3 stores: 1 complete, 1 partial, 0 running, 0 damaged, 0 other plan, 1 not started" in (
        run.stdout
    )
    assert f"tilestore embed {bare} --model {LITE} --dtype float32 --precision fp32" in run.stdout
    # no store holds any: each not started, the model the user's to name (exit 1)
    alone = tilestore("status", bare)
    assert alone.returncode == 1 and alone.stderr == "", alone.stderr
    assert alone.stdout.splitlines() == [
        f"{bare}  not started",
        "1 store: 1 not started (no embeddings of any model); name the model with --model for "
        "the command that embeds them",
    ]
    # two models: asked, in one line, exit 2
    tiles = zarr.open_group(done / group_of(done, LITE), mode="r")["x"].shape[0]
    write_features(half, {"name": "other"}, np.ones((tiles, 4), np.float32), plan="classes")
    asked = tilestore("status", done, half)
    assert asked.returncode == 2 and asked.stdout == ""
    assert asked.stderr.strip().splitlines() == [
        f"tilestore: error: which model? embeddings found: {LITE} (2 stores), other (1 store); "
        "name one with --model <name>"
    ]


def test_info_says_each_models_embeddings(embedded_cohort, tmp_path):
    from tilestore.embed.slides import embed_slides

    store = tmp_path / "a.ome.zarr"
    shutil.copytree(embedded_cohort[0], store)
    embed_slides([store], "mean", model=LITE, device="cpu")
    described = json.loads(tilestore("info", store, "--json").stdout)
    (group,) = described["embeddings"]
    assert group["model"] == LITE and group["state"] == "complete" and group["plan"] == "classes"
    assert group["tiles"] == group["tiles_done"] > 0 and group["dim"] == 1280
    assert group["slide_vectors"] == [{"encoder": "mean", "dim": 1280, "state": "current"}]
    assert group["run"] == {"batch_size": 16, "dtype": "float32", "precision": "fp32"}
    table = " ".join(tilestore("info", store).stdout.split())
    assert f"embeddings {LITE}: complete, {group['tiles']} of {group['tiles']} tiles of plan " in (
        table
    )
    assert "slide vectors: mean" in table


# --- the printed command carries every flag the run needs --------------------------------


def _finish_as_printed(expected: dict[Path, list[str]]) -> None:
    """`status` on stores left: the command it prints for each store holds the flags
    `expected` for it and, run as printed (on the CPU), completes it; `status` then says
    every store is complete, exit 0."""
    run = tilestore("status", *expected, "--model", LITE)
    assert run.returncode == 1, run.stdout + run.stderr
    commands = [line.strip() for line in run.stdout.splitlines() if line.startswith("  ")]
    assert len(commands) == len(expected), commands
    for (store, flags), command in zip(expected.items(), commands, strict=True):
        assert command.startswith(f"tilestore embed {store} "), command
        words = shlex.split(command)
        assert [w for w in flags if w not in words] == [], command
        ran = tilestore(*words[1:], "--device", "cpu", env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert ran.returncode == 0, ran.stdout + ran.stderr
    after = tilestore("status", *expected, "--model", LITE)
    assert after.returncode == 0, after.stdout + after.stderr
    assert f"{len(expected)} stores: {len(expected)} complete," in after.stdout


def test_the_printed_command_finishes_a_multichannel_store_of_tiles_not_the_models_input(
    tmp_path,
):
    """A QPTIFF (three markers) embedded from three channels chosen as R, G, B, in 256 px
    tiles where efficientnet-lite0 reads 224 (--any-scale), stopped at --max-tiles: the
    command printed repeats the channels, --any-scale and the plan (before: no --any-scale,
    so the run it printed refused the store)."""
    import tifffile

    from tests.conftest import DATA, NDPI
    from tests.tilestore import tiffs

    pixels = tifffile.imread(real(DATA / "slides" / NDPI), level=1)[:768, :768]
    markers = {"DAPI": "0,0,255", "CD8": "0,255,0", "PanCK": "255,0,0"}
    planes = {name: (color, pixels[..., 2 - i]) for i, (name, color) in enumerate(markers.items())}
    slide = tiffs.qptiff(tmp_path / "vectra.qptiff", planes)
    assert tilestore("convert", slide, "-o", tmp_path / "out").returncode == 0
    store = tmp_path / "out" / "vectra.ome.zarr"
    planned = tilestore("plan", store, "--mpp", "0.5", "--tile", "256", "--min-tissue", "0")
    assert planned.returncode == 0, planned.stderr
    first = tilestore("embed", store, "--model", LITE, "--channels", "DAPI,CD8,PanCK",
                      "--any-scale", "--max-tiles", "2", "--batch-size", "2", "--device", "cpu",
                      env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert first.returncode == 0, first.stderr
    expected = ["--channels", "DAPI,CD8,PanCK", "--any-scale", "--plan", "0.5mpp-256px-t0"]
    _finish_as_printed({store: expected})


def test_the_printed_commands_finish_stores_without_a_pixel_size(slide_path, tmp_path):
    """kidney-48-5.tif has no pixel size: planned in level-0 pixels (--mpp level0) in 256 px
    tiles (not the model's 224: --any-scale). One store stopped at --max-tiles, one not
    started that holds the cohort's plan and another: the commands printed name the level-0
    plan and --any-scale for both, and finish them (before: neither flag for the store not
    started, whose run then made the default 0.5 um/px plan and was refused; no --any-scale
    for the other, refused too)."""
    from tests.conftest import KIDNEY

    stores = []
    for folder in ("a", "b"):
        assert tilestore("convert", slide_path(KIDNEY), "-o", tmp_path / folder).returncode == 0
        stores.append(tmp_path / folder / "kidney-48-5.ome.zarr")
        for tile in ("256", "224")[: 1 + (folder == "b")]:
            planned = tilestore("plan", stores[-1], "--mpp", "level0", "--tile", tile,
                                "--min-tissue", "0")  # fmt: skip
            assert planned.returncode == 0, planned.stderr
    first = tilestore("embed", stores[0], "--model", LITE, "--any-scale", "--max-tiles", "2",
                      "--batch-size", "2", "--device", "cpu",
                      env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert first.returncode == 0, first.stderr
    flags = ["--any-scale", "--plan", "level0-256px-t0"]
    _finish_as_printed({stores[0]: [*flags, "--batch-size"], stores[1]: flags})


def test_tiles_that_are_the_models_input_need_no_any_scale(embedded_cohort, tmp_path):
    """The flag only where the run needs it: CMU's 224 px tiles at 0.5 um/px are
    efficientnet-lite0's input."""
    half = tmp_path / "b.ome.zarr"
    shutil.copytree(embedded_cohort[0], half)
    interrupt(half)
    as_json = json.loads(tilestore("status", half, "--json").stdout)
    assert as_json["stores"][0]["tile"] == 224 and as_json["stores"][0]["mpp"] is not None
    assert "any_scale" not in as_json["stores"][0]["run"]
    assert "--any-scale" not in as_json["commands"][0]


def _nan_written(store: Path) -> str:
    zarr.open_array(store / group_of(store, LITE) / "features", mode="r+")[3, 5] = np.nan
    return "features: rows 0-15 are not as written (1 chunk not those written there"


def _shard_deleted(store: Path) -> str:
    (store / group_of(store, LITE) / "features" / "c" / "0" / "0").unlink()  # its only shard
    return "chunks missing where written"


def _dtype_changed(store: Path) -> str:
    meta = store / group_of(store, LITE) / "features" / "zarr.json"
    doc = json.loads(meta.read_text())
    meta.write_text(json.dumps({**doc, "data_type": "float64"}))
    return "features is float64 where the group records float32"


def test_what_readers_refuse_is_damaged_and_embed_refuses_it_until_overwrite(
    embedded_cohort, tmp_path
):
    """NaN written into a finished group's features, its features shard deleted, its dtype
    edited: `status` said complete (exit 0) and `embed` skipped them as complete, which every
    reader refuses. Now: damaged, exit 2, the readers' line; `embed` refuses in one line
    saying to pass --overwrite, before the model loads; `verify` lists the chunks."""
    stores = []
    for damage in (_nan_written, _shard_deleted, _dtype_changed):
        store = tmp_path / f"{damage.__name__}.ome.zarr"
        shutil.copytree(embedded_cohort[0], store)
        stores.append((store, damage(store)))
    run = tilestore("status", *[s for s, _ in stores], "--model", LITE, "--json")
    assert run.returncode == 2, run.stderr
    rows = json.loads(run.stdout)["stores"]
    assert [row["state"] for row in rows] == ["damaged"] * 3
    for row, (store, said) in zip(rows, stores, strict=True):
        assert row["note"].startswith(f"{store}: {group_of(store, LITE)}/") and said in row["note"]
    store, said = stores[0]
    refused = tilestore("embed", store, "--model", LITE, "--device", "cpu")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (line,) = [x for x in refused.stderr.splitlines() if x.startswith("tilestore: error: ")]
    assert said in line and line.endswith("pass --overwrite to embed again"), line
    checked = tilestore("verify", store)
    assert checked.returncode == 2 and f"{group_of(store, LITE)}/features chunk (0, 0)" in (
        checked.stderr
    )
