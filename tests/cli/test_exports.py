"""`tilestore export` is the library's registry of exports (`tilestore.exports.EXPORTS`): every
subcommand is a registered export and every registered export a subcommand, each shows the
registry's help and what it reads and writes, and each calls the writer the registry names,
on real embedded stores."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import tilestore.exports
from tilestore.cli.export import export_app
from tilestore.cli.main import app
from tilestore.errors import ExportError
from tilestore.exports import EXPORTS, SUFFIXES, table_format

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


def test_every_registered_writer_is_offered_by_the_face():
    for export in EXPORTS:
        assert export.writer in tilestore.exports.__all__
        assert callable(export.load())


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
