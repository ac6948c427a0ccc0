"""The house's shape: imports run one way, no module imports itself back, light faces stay
light. The import graph is grimp's (the library under import-linter), TYPE_CHECKING
imports included: a loop hidden from the interpreter is still a loop for the reader."""

from __future__ import annotations

import subprocess
import sys

import grimp
import pytest

PACKAGES = ("cli", "embed", "tilestore")
MAY_IMPORT = {
    "cli": {"cli", "embed", "tilestore"},
    "embed": {"embed", "tilestore"},
    "tilestore": {"tilestore"},
}


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(
        *PACKAGES,
        include_external_packages=True,
        exclude_type_checking_imports=False,
        cache_dir=None,  # a stale cache once showed modules long gone
    )


def _edges(graph):
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported.split(".")[0] in PACKAGES:
                yield importer, imported


def test_no_module_imports_itself_back(graph):
    loops = [
        [importer, *graph.find_shortest_chain(importer=imported, imported=importer)]
        for importer, imported in _edges(graph)
        if graph.chain_exists(importer=imported, imported=importer)
    ]
    assert loops == []


def test_imports_run_cli_to_embed_to_tilestore(graph):
    against = [
        (importer, imported)
        for importer, imported in _edges(graph)
        if imported.split(".")[0] not in MAY_IMPORT[importer.split(".")[0]]
    ]
    assert against == []


def test_storage_never_imports_torch(graph):
    """tilestore needs no torch: only the QC detectors compute with it (on the GPU where
    there is one); reading, planning and the embeddings format never import it."""
    assert {
        m for m in graph.find_modules_that_directly_import("torch") if m.startswith("tilestore")
    } <= {"tilestore.qc.colour", "tilestore.qc.detectors", "tilestore.qc.maps"}


@pytest.mark.parametrize(
    ("module", "not_loaded"),
    [
        ("tilestore.errors", ("zarr", "dask", "xarray", "torch")),
        ("tilestore", ("zarr", "dask", "xarray", "torch")),
        ("embed", ("torch", "zarr")),
        ("embed.procdecode", ("torch", "zarr", "xarray")),  # each decoder worker imports it
        ("embed.settings", ("torch",)),  # the CLI reads its defaults
        # the command starts the slide worker before it imports torch; the worker imports it
        ("cli.embed", ("torch", "timm")),
        ("embed.inputs", ("torch", "timm", "dask", "xarray")),
        ("tilestore.plans", ("torch",)),  # plans read stored QC, never compute it
        ("tilestore.qc.report", ("torch",)),
        # an embed run writes embeddings and plans from stored masks: reading them back
        # (dask, xarray, pandas) and computing masks (scipy) are loaded only when asked
        ("embed.engine", ("dask", "xarray", "pandas", "scipy")),
        ("cli.embed", ("dask", "xarray", "pandas", "scipy")),
    ],
)
def test_light_modules_stay_light(module, not_loaded):
    code = f"import sys, {module}; print(sorted(m for m in {not_loaded!r} if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["tilestore", "embed"])
def test_every_public_name_resolves(package):
    module = __import__(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
