"""`tilestore export` is the library's registry of exports (`tilestore.exports.EXPORTS`): every
subcommand is a registered export and every registered export a subcommand, each shows the
registry's help and what it reads and writes, and each calls the writer the registry names,
on real embedded stores."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

import tilestore.exports
from tilestore.cli.export import build, export_app
from tilestore.cli.main import app
from tilestore.errors import ExportError
from tilestore.exports import EXPORTS, SUFFIXES, Export, Exported, table_format
from tilestore.options import Opt, checked

MODEL = "efficientnet-lite0"

# What each export's command needs: an embedded store (with a slide embedding for `slides`)
# and an output in a fresh folder.
NEEDS = {
    "ome-tiff": lambda s, o: [s.store, "-o", o / "x.ome.tiff"],
    "qupath": lambda s, o: [s.store, "-m", MODEL, "-o", o / "x.geojson"],
    "anndata": lambda s, o: [s.store, "-m", MODEL, "-o", o / "x.h5ad"],
    "map": lambda s, o: [s.store, "-m", MODEL, "-o", o / "x.png"],
    "heatmap": lambda s, o: [s.store, "-m", MODEL, "--column", "tissue", "--png", o / "h.png"],
    "h5": lambda s, o: [s.store, "-m", MODEL, "-o", o / "h5"],
    "slides": lambda s, o: [s.pooled, "-m", MODEL, "-s", "mean", "-o", o / "s.parquet"],
}


class Stores:
    """An embedded CMU-1-Small-Region store, and a copy of it with a mean slide embedding."""

    def __init__(self, store, pooled):
        self.store, self.pooled = store, pooled


@pytest.fixture(scope="module")
def embedded(embedded_cohort, tmp_path_factory):
    from tilestore.embed.slides import embed_slides

    pooled = tmp_path_factory.mktemp("pooled") / embedded_cohort[0].name
    shutil.copytree(embedded_cohort[0], pooled)
    embed_slides([pooled], "mean", model=MODEL, device="cpu")
    return Stores(embedded_cohort[0], pooled)


def test_every_subcommand_is_a_registered_export_and_every_export_a_subcommand():
    commands = [info.name for info in export_app.registered_commands]
    assert commands == [export.name for export in EXPORTS]
    assert set(NEEDS) == set(commands)


def test_each_subcommand_shows_the_registrys_help():
    for info in export_app.registered_commands:
        export = tilestore.exports.get_export(info.name)
        assert info.short_help == export.summary
        assert info.help.split("\n\n")[0] == export.help
    listed = subprocess.run(
        [sys.executable, "-m", "tilestore.cli", "export", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "400"},
    ).stdout
    for export in EXPORTS:
        assert export.summary in listed, export.name
    assert "a store's pixels (ome-tiff)" in listed


def test_every_registered_writer_and_command_is_offered_by_the_face():
    for export in EXPORTS:
        assert export.writer in tilestore.exports.__all__
        assert export.command in tilestore.exports.__all__
        assert getattr(tilestore.exports, export.writer) is export.load()
        assert getattr(tilestore.exports, export.command) is export.load_command()


TOY_CALLS: list = []


@checked
def export_toy(
    stores: Annotated[list[str], Opt("Stores.")],
    *,
    model: Annotated[str, Opt("The model.", short="m")],
    output: Annotated[Path, Opt("The file.", short="o", writes="file")],
    k: Annotated[int, Opt("Clusters.", low=2, high=9)] = 3,
) -> Exported:
    """A toy export's command (`test_a_new_export_is_its_module_and_a_registry_line`)."""
    TOY_CALLS.append((stores, model, output, k))
    return Exported((f"{len(stores)} stores, k={k} -> {output}",))


class Called(Exception):
    """Raised by the stand-in writer: the command reached it."""


@pytest.mark.parametrize("name", [export.name for export in EXPORTS])
def test_each_subcommand_calls_the_writer_the_registry_names(name, embedded, tmp_path, monkeypatch):
    export = tilestore.exports.get_export(name)
    module = sys.modules[export.load().__module__]
    calls = []

    def stand_in(*args, **kwargs):
        calls.append((args, kwargs))
        raise Called(name)

    monkeypatch.setattr(module, export.writer, stand_in)
    result = CliRunner().invoke(app, ["export", name, *map(str, NEEDS[name](embedded, tmp_path))])
    assert isinstance(result.exception, Called), (result.exception, result.output)
    assert len(calls) == 1


def test_a_slide_tables_suffix_says_its_writer():
    assert SUFFIXES == (".parquet", ".csv", ".h5ad")
    assert table_format("cohort.PARQUET") == ".parquet"
    with pytest.raises(ExportError, match=r"cohort\.txt: write a \.parquet, \.csv or \.h5ad file"):
        table_format("cohort.txt")


def test_a_slide_table_of_another_type_is_one_line_before_any_store_is_read(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "tilestore.cli", "export", "slides", str(tmp_path / "none.ome.zarr"),
         "-m", MODEL, "-s", "mean", "-o", str(tmp_path / "cohort.txt")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"tilestore: error: {tmp_path / 'cohort.txt'}: write a .parquet, .csv or .h5ad file"
    ]
    assert not (tmp_path / "cohort.txt").exists()


def test_a_new_export_is_its_module_and_a_registry_line(tmp_path, monkeypatch):
    """The builder makes a subcommand of an export it has never seen: its argument, its
    flags (a short one, a required one, a checked number), its output's folder made before
    the function runs, the lines the function returns printed; a bad value is refused
    before the function runs."""
    calls = TOY_CALLS
    calls.clear()
    module = types.ModuleType("tilestore.exports.toy")
    module.export_toy = export_toy
    module.write_toy = lambda: None
    monkeypatch.setitem(sys.modules, "tilestore.exports.toy", module)
    toy = Export("toy", "tile embeddings", (".toy",), "toy", "write_toy", "export_toy", "A toy.")
    app = typer.Typer()
    app.command("toy")(build(toy))
    app.command("other")(lambda: None)  # two commands: typer keeps the subcommand's name
    target = tmp_path / "made" / "x.toy"
    done = CliRunner().invoke(app, ["toy", "a", "b", "-m", "uni", "-o", str(target), "--k", "4"])
    assert done.exit_code == 0, done.output
    assert calls == [(["a", "b"], "uni", target, 4)]
    assert target.parent.is_dir()  # made ready before the function ran
    assert done.output.strip() == f"2 stores, k=4 -> {target}"
    calls.clear()
    missing = CliRunner().invoke(app, ["toy", "a", "-o", str(target)])
    assert missing.exit_code == 2 and "--model" in missing.output and calls == []
    refused = CliRunner().invoke(app, ["toy", "a", "-m", "uni", "-o", str(target), "--k", "1"])
    assert "k=1: must be a whole number from 2 to 9" in str(refused.exception) and calls == []
