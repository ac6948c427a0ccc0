"""Every command refuses a bad number at the door: one line naming the flag, the value and what
is allowed, exit code 2, before anything is written and before torch is imported or a model
loaded; and `embed` refuses what a store's metadata already refuses (another plan, channels
it lacks, tiles that are not the model's input) before it loads the model.

The commands, their flags and what each allows are read from the command itself and the
declarations it is generated from (`tilestore.cli.flags`), so a command or flag added later
is tried too. Every (command, flag, bad value) runs in one Python process of its own, the
way the console entry point runs it, which then also says whether torch was ever imported.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import zarr

from tests.conftest import CMU, KIDNEY, NDPI, REPO, group_of
from tilestore.cli.main import app
from tilestore.errors import OptionError
from tilestore.options import Declaration

MODEL = "efficientnet-lite0"

# What each command needs besides the flag tried: real inputs, outputs in a fresh folder.
NEEDS = {
    "convert": lambda s, o: [s.slide, "-o", o / "stores"],
    "tissue": lambda s, o: [s.store],
    "plan": lambda s, o: [s.store],
    "reshard": lambda s, o: [s.store],
    "embed": lambda s, o: [s.store, "--model", MODEL, "--device", "cpu", "--into", o / "in"],
    "verify": lambda s, o: [s.store],
    "qc": lambda s, o: [s.store],
    "view": lambda s, o: [s.store],
    "models profile": lambda s, o: [MODEL, "--device", "cpu"],
    "models compile": lambda s, o: [MODEL, "--device", "cpu", "--compile-cache", o / "cc"],
    "export ome-tiff": lambda s, o: [s.store, "-o", o / "x.ome.tiff"],
    "export qupath": lambda s, o: [s.store, "-m", MODEL, "-o", o / "x.geojson"],
    "export anndata": lambda s, o: [s.store, "-m", MODEL, "-o", o / "x.h5ad"],
    "export map": lambda s, o: [s.store, "-m", MODEL, "-o", o / "x.png"],
    "export heatmap": lambda s, o: [
        s.store,
        "-m",
        MODEL,
        "--column",
        "tissue",
        "--png",
        o / "h.png",
    ],
    "export h5": lambda s, o: [s.store, "-m", MODEL, "-o", o / "h5"],
    "export slides": lambda s, o: [s.store, "-m", MODEL, "-s", "mean", "-o", o / "s.parquet"],
    "crossval": lambda s, o: [*_labelled(s, o), "--out", o / "run"],
    "train": lambda s, o: [*_labelled(s, o), "--out", o / "run"],
}


def _labelled(s, o) -> list:
    """A clinical table naming the store's slide as its patient, the store, the model and
    the target (what `crossval` and `train` need besides the flag tried)."""
    labels = o.parent / "labels"  # beside the outputs, which a refusal must leave empty
    labels.mkdir(parents=True, exist_ok=True)
    table = labels / "clinical.csv"
    table.write_text(f"PATIENT,status\n{Path(s.store).name.split('.')[0]},pos\n")
    return [table, s.store, "--model", MODEL, "--target", "status"]


# Runs each command line as `tilestore` would (tilestore.cli.main._main), in this process.
DRIVER = r"""
import contextlib, io, json, sys, time
from tilestore.cli.main import _main
results = []
for argv in json.load(sys.stdin):
    err, out = io.StringIO(), io.StringIO()
    sys.argv = ["tilestore", *argv]
    started = time.perf_counter()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            _main()
        except SystemExit as done:
            code = done.code
    results.append({"rc": code, "err": err.getvalue(), "out": out.getvalue(),
                    "s": time.perf_counter() - started, "torch": "torch" in sys.modules,
                    "timm": "timm" in sys.modules})
print(json.dumps(results))
"""


def run_in_one_process(argvs: list[list[str]]) -> list[dict]:
    run = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps([[str(a) for a in argv] for argv in argvs]),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def commands():
    """(name, callback) of every command of the `tilestore` app."""
    for info in app.registered_commands:
        yield info.name or info.callback.__name__, info.callback
    for group in app.registered_groups:
        for info in group.typer_instance.registered_commands:
            yield f"{group.name} {info.name or info.callback.__name__}", info.callback


def numeric_flags():
    """(command, flag, declaration) of every flag that takes a number."""
    for name, callback in commands():
        for flag, declaration in getattr(callback, "flag_declarations", {}).items():
            if declaration.kind.number is not None or declaration.kind.items is int:
                yield name, flag, declaration


def bad_values(declaration: Declaration, draw: random.Random) -> list[str]:
    """Text a user could type that the declared range excludes: 0, negative, NaN,
    infinities, huge, just outside the range, a fraction where a whole number belongs, a
    word, and a few numbers drawn at random beyond each end. Judged here from the range as
    declared (`_outside`), not by the parser under test."""
    opt = declaration.opt
    candidates = ["0", "-1", "-0.5", "nan", "inf", "-inf", "1e30", str(10**20), "2.5", "many"]
    if opt.low is not None:
        candidates += [repr(opt.low - 1e-6), repr(opt.low - draw.uniform(1, 1e6))]
    if opt.high is not None:
        candidates += [repr(opt.high + 1), repr(opt.high * draw.uniform(1.5, 1e6))]
    return [text for text in dict.fromkeys(candidates) if _outside(declaration, text)]


def _outside(declaration: Declaration, text: str) -> bool:
    """Whether the declaration's range excludes this text, worked out from the range."""
    kind, opt = declaration.kind, declaration.opt
    if text in kind.words or text == opt.none_word:
        return False
    try:
        number = float(text)
    except ValueError:
        return True  # a word where a number belongs
    if not math.isfinite(number):
        return True
    counted = kind.number is int or kind.items is int  # whole numbers only, typed as such
    if counted and (number != int(number) or "." in text or "e" in text.lower()):
        return True
    if opt.low is not None and (number <= opt.low if opt.above else number < opt.low):
        return True
    if opt.high is not None and number > opt.high:
        return True
    return opt.multiple is not None and number % opt.multiple != 0


class Inputs:
    def __init__(self, slide: Path, store: Path) -> None:
        self.slide, self.store = slide, store


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def test_every_commands_every_number_is_refused_at_the_door(tmp_path, store, slide_path):
    inputs = Inputs(slide_path(CMU), store())
    out = tmp_path / "out"
    flags = list(numeric_flags())
    tried = {name for name, _, _ in flags}
    assert tried <= set(NEEDS), (
        f"commands with numeric flags and no inputs here: {tried - set(NEEDS)}"
    )
    draw = random.Random(53)
    cases = [
        (name, flag, text)
        for name, flag, declaration in flags
        for text in bad_values(declaration, draw)
    ]
    argvs = [
        [*name.split(), *NEEDS[name](inputs, out), f"--{flag.replace('_', '-')}", text]
        for name, flag, text in cases
    ]
    before = _tree(inputs.store.parent)
    results = run_in_one_process(argvs)
    wrong = []
    for (name, flag, text), result in zip(cases, results, strict=True):
        lines = result["err"].strip().splitlines()
        dashed = f"--{flag.replace('_', '-')}"
        ok = (
            result["rc"] == 2
            and len(lines) == 1
            and lines[0].startswith(f"tilestore: error: {dashed} ")
            and "must be" in lines[0]
            and not result["out"].strip()
        )
        if not ok:
            wrong.append(f"{name} {dashed} {text}: rc {result['rc']}, {result['err'][:200]!r}")
    assert wrong == []
    assert not any(r["torch"] or r["timm"] for r in results), "torch imported before a refusal"
    assert _tree(inputs.store.parent) == before, "a refused command changed the store"
    assert not out.exists() or not any(out.rglob("*")), "a refused command left files behind"
    assert len({name for name, _, _ in cases}) >= 13 and len(cases) >= 400, len(cases)
    slowest = max(results, key=lambda r: r["s"])
    (tmp_path / "refusals.json").write_text(
        json.dumps({"tried": len(cases), "slowest_s": slowest["s"]})
    )
    assert slowest["s"] < 10, f"a refusal took {slowest['s']:.1f} s"
    print(f"{len(cases)} (command, flag, bad value) refused; slowest {slowest['s'] * 1e3:.0f} ms")


def test_the_slowest_refusal_is_a_parse_not_work(tmp_path, store, slide_path):
    """The refusals are made from the flags alone: a refusal costs what parsing costs, a
    few milliseconds, whatever the store (here the command line alone is timed)."""
    inputs = Inputs(slide_path(CMU), store())
    argv = [*NEEDS["embed"](inputs, tmp_path), "--tile", "0"]
    results = run_in_one_process([["embed", *argv]] * 5)
    assert all(r["rc"] == 2 for r in results)
    assert max(r["s"] for r in results[1:]) < 1.0  # the first pays the command's imports


# -- store refusals before the model loads ---------------------------------------------------


@pytest.fixture(scope="module")
def refused_stores(tmp_path_factory, stores):
    """Stores a run must refuse (or skip) from their metadata: embedded from another plan,
    a fluorescence scan stored as RGB, a slide without a pixel size, a complete one."""
    import shutil

    from tilestore.embed import Options, embed
    from tilestore.plan import PlanOptions

    root = tmp_path_factory.mktemp("refused")
    made = {}
    for name, slide in (("other", CMU), ("complete", CMU), ("ndpi", NDPI), ("kidney", KIDNEY)):
        made[name] = root / f"{name}.ome.zarr"
        shutil.copytree(stores(slide), made[name])
    options = Options(batch_size=16, device="cpu", precision="fp32", dtype="float32")
    for name in ("other", "complete"):
        embed([made[name]], MODEL, plan=PlanOptions(mpp=1.0, min_tissue=0.9), options=options)
    return made


def test_what_a_store_refuses_is_said_before_the_model_loads(refused_stores):
    cases = {
        "a plan of its name made otherwise": (
            [
                *("embed", refused_stores["other"], "--model", MODEL, "--mpp", "1"),
                *("--name", "1mpp-224px-t0.9"),
            ],
            "plan '1mpp-224px-t0.9' is stored already, made otherwise (stored -> now: "
            "--min-tissue 0.9 -> 0.5)",
        ),
        "fluorescence as RGB": (
            ["embed", refused_stores["ndpi"], "--model", MODEL],
            "a fluorescence scan stored as RGB",
        ),
        "not the model's tiles": (
            ["embed", refused_stores["other"], "--model", "uni", "--tile", "32", "--overwrite"],
            "32 px tiles where the model reads 224 px",
        ),
        "no pixel size, a model of one": (
            ["embed", refused_stores["kidney"], "--model", "uni", "--mpp", "level0"],
            "their pixel size is unknown (the model reads 0.5 um/px)",
        ),
    }
    results = run_in_one_process([argv for argv, _ in cases.values()])
    for (what, (_, said)), result in zip(cases.items(), results, strict=True):
        assert result["rc"] == 2, (what, result["err"])
        assert said in result["err"], (what, result["err"])
        assert len(result["err"].strip().splitlines()) == 1, (what, result["err"])
        assert not result["torch"], f"{what}: torch was imported before the refusal"


def test_a_run_with_nothing_to_do_loads_nothing(refused_stores):
    """Complete for the store's plan (named, or its only one): skipped, no model loaded."""
    argv = ["embed", refused_stores["complete"], "--model", MODEL, "--plan", "1mpp-224px-t0.9"]
    (result,) = run_in_one_process([argv])
    assert result["rc"] == 0, result["err"]
    assert "already complete" in result["out"] and not result["torch"]


def test_the_refused_and_the_runnable_go_their_ways(refused_stores, store):
    """One refused store does not stop the others: they are embedded, the refusal is in
    the run's report and the exit code is 3 (some done, some not: `embed.outcome`)."""
    good = store()
    run = subprocess.run(
        [sys.executable, "-m", "tilestore.cli", "embed", str(refused_stores["ndpi"]), str(good),
         "--model", MODEL, "--device", "cpu", "--max-tiles", "8"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 3
    assert "a fluorescence scan stored as RGB" in run.stderr
    assert f"{good}: 32 tiles" in run.stdout  # whole batches of 32 on the CPU
    assert "plan 0.5mpp-224px: 224 px tiles at 0.499 um/px, from level 0 (read as is); RGB" in (
        run.stdout
    )


def test_on_dask_the_refused_and_the_runnable_exit_alike(refused_stores, store):
    """The same rule on a Dask cluster: the refused store named, the other embedded, 3."""
    good = store()
    run = subprocess.run(
        [sys.executable, "-m", "tilestore.cli", "embed", str(refused_stores["ndpi"]), str(good),
         "--model", MODEL, "--device", "cpu", "--cluster", "local", "--workers", "1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 3, run.stderr
    assert "a fluorescence scan stored as RGB" in run.stderr
    assert f"{good.name}: " in run.stdout and "tiles on 1 worker(s)" in run.stdout
    group = zarr.open_group(good / group_of(good, MODEL), mode="r")
    assert group.attrs["tilestore"]["complete"]


# where 0 is a quantity: fractions, thresholds, and heatmap's tile number (the first tile)
ZERO_IS_A_VALUE = {"min_tissue", "min_roi", "tolerance", "max_artefact", "max_blur",
                   "flag_fraction", "contrast_min", "contrast_max", "contrast_p5",
                   "contrast_median", "export heatmap --tile", "dropout", "weight_decay",
                   "seed"}  # fmt: skip


def test_a_number_outside_every_range_is_never_a_default():
    """The numbers that once became defaults (0, negative) and the ones no range holds
    (NaN, infinities) are refused by every numeric flag, except 0 where it is a quantity."""
    for name, flag, declaration in numeric_flags():
        for text in ("nan", "inf", "-inf", "1e30", "-1"):
            with pytest.raises(OptionError):
                declaration.parse(text)
        if flag in ZERO_IS_A_VALUE or f"{name} --{flag}" in ZERO_IS_A_VALUE:
            declaration.parse("0")
        else:
            with pytest.raises(OptionError):
                declaration.parse("0")
