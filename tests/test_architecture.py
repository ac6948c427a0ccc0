"""The house's shape: tilestore's packages on floors, imports running only downwards, no module
importing itself back, light faces staying light, and the command reaching the library only
through its packages' public faces. The import graph is grimp's (the library under
import-linter), TYPE_CHECKING imports included: a loop hidden from the interpreter is still
a loop for the reader. ARCHITECTURE.md draws the same floors."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]

# top to bottom: a package may import its own floor's modules and those below, never above
FLOORS = (
    ("tilestore.cli",),
    ("tilestore.embed",),
    ("tilestore.learn",),  # issue 65: models trained on stored features
    ("tilestore.exports",),
    ("tilestore.view",),
    ("tilestore.embeddings",),
    ("tilestore.plan",),
    ("tilestore.qc",),
    # conversion makes a store's tissue mask beside its levels (`conversion.beside`)
    ("tilestore.conversion",),
    ("tilestore.masks",),
    ("tilestore.analysis",),
    ("tilestore.reading",),
    ("tilestore.sources",),
    ("tilestore.format",),
    (
        "tilestore.errors",
        "tilestore.caches",
        "tilestore.cpus",
        "tilestore.urls",
        "tilestore.faces",
        "tilestore.locks",
        "tilestore.options",
        "tilestore.progress",
        "tilestore.stopping",
        "tilestore.workers",
        "tilestore.calling",
    ),
)
# conversion writes stores: only the job (embed) and the command start it, never a reader,
# a plan, QC, analysis, the viewer or an export (an OME-TIFF reads a store, it is not its
# write path)
MAY_CONVERT = ("tilestore.cli", "tilestore.embed", "tilestore.conversion")
FACES = (
    "tilestore",
    "tilestore.analysis",
    "tilestore.conversion",
    "tilestore.embed",
    "tilestore.embed.models",
    "tilestore.embed.slides",
    "tilestore.embeddings",
    "tilestore.exports",
    "tilestore.format",
    "tilestore.learn",
    "tilestore.masks",
    "tilestore.options",
    "tilestore.plan",
    "tilestore.progress",
    "tilestore.qc",
    "tilestore.reading",
    "tilestore.sources",
    "tilestore.view",
)


_EDGES = """
import json, grimp
g = grimp.build_graph(
    "tilestore", include_external_packages=True, exclude_type_checking_imports=False,
    cache_dir=None,  # a stale cache once showed modules long gone
)
print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))
"""


def import_graph(root: Path = ROOT) -> grimp.ImportGraph:
    """The import graph of tilestore as installed: embed/ and cli/ inside it as tilestore.embed
    and tilestore.cli (grimp reads folders, and an editable install maps them from outside
    tilestore/). Laid out in a temporary folder and read by grimp in a fresh process."""
    with tempfile.TemporaryDirectory() as folder:
        package = Path(folder) / "tilestore"
        shutil.copytree(root / "tilestore", package, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("embed", "cli"):
            shutil.copytree(
                root / name, package / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        run = subprocess.run(
            [sys.executable, "-c", _EDGES],
            cwd=folder,
            env={**os.environ, "PYTHONPATH": folder},
            capture_output=True,
            text=True,
            check=True,
        )
    graph = grimp.ImportGraph()
    for importer, imported in json.loads(run.stdout).items():
        graph.add_module(importer)
        for name in imported:
            graph.add_import(importer=importer, imported=name)
    return graph


@pytest.fixture(scope="module")
def graph():
    found = import_graph()
    assert "tilestore.embed.engine" in found.modules and "tilestore.cli.main" in found.modules
    return found


def _floor(module: str) -> int:
    for index, floor in enumerate(FLOORS):
        if any(module == p or module.startswith(p + ".") for p in floor):
            return index
    raise AssertionError(f"{module} is on no floor: add its package to FLOORS")


def _edges(graph):
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported.split(".")[0] == "tilestore":
                yield importer, imported


def _below_the_face(graph):
    """Every edge but the top face's (its TYPE_CHECKING block names everything it offers)."""
    return [(a, b) for a, b in _edges(graph) if a != "tilestore" and b != "tilestore"]


def test_every_module_is_on_a_floor(graph):
    for module in graph.modules:
        if module.startswith("tilestore") and module != "tilestore":
            _floor(module)


def test_imports_run_down_the_floors(graph):
    upwards = [(a, b) for a, b in _below_the_face(graph) if _floor(b) < _floor(a)]
    assert upwards == []


def test_no_module_imports_itself_back(graph):
    loops = [
        [importer, *graph.find_shortest_chain(importer=imported, imported=importer)]
        for importer, imported in _edges(graph)
        if graph.chain_exists(importer=imported, imported=importer)
    ]
    assert loops == []


def test_reading_never_reaches_conversion(graph):
    for package in (
        "tilestore.reading",
        "tilestore.plan",
        "tilestore.qc",
        "tilestore.analysis",
        "tilestore.view",
        "tilestore.exports",
        "tilestore.learn",
    ):
        assert not graph.chain_exists(
            importer=package, imported="tilestore.conversion", as_packages=True
        ), graph.find_shortest_chains(importer=package, imported="tilestore.conversion")
    importers = {a for a, b in _below_the_face(graph) if b.startswith("tilestore.conversion")}
    assert {a for a in importers if not a.startswith(MAY_CONVERT)} == set()


def test_learning_reads_stored_features_only(graph):
    """tilestore.learn sits above exports and the viewer but uses neither: it reads stored
    features (embeddings, format, reading) and writes its scores through embeddings; the
    viewer and the exports show them from the store."""
    for below in ("tilestore.conversion", "tilestore.view", "tilestore.exports"):
        assert not graph.chain_exists(
            importer="tilestore.learn", imported=below, as_packages=True
        ), graph.find_shortest_chains(importer="tilestore.learn", imported=below)


def test_nothing_imports_the_old_top_level_names(graph):
    """embed and cli are installed under tilestore only: a bare `import embed` would find
    someone else's package (or none)."""
    assert "embed" not in graph.modules and "cli" not in graph.modules


def test_storage_never_imports_torch(graph):
    """Storage needs no torch: only the QC detectors compute with it (on the GPU where
    there is one); reading, planning and the embeddings format never import it."""
    users = {
        m
        for m in graph.find_modules_that_directly_import("torch")
        if not m.startswith(("tilestore.embed", "tilestore.learn"))  # learning trains with it
    }
    assert users <= {
        "tilestore.qc.colour",
        "tilestore.qc.detectors",
        "tilestore.qc.fine",  # the maps' fine blur pass
        "tilestore.qc.maps",
        "tilestore.qc.tilewise",  # the per-tile measures, on the GPU in the embedding pass
    }


def _cli_imports():
    for path in sorted((ROOT / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("tilestore")
            ):
                yield path.name, node.module, [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("tilestore"):
                        yield path.name, alias.name, []


def test_the_command_imports_only_public_faces():
    """The command decides nothing: it reaches the library through the names its packages'
    faces offer (`__all__`), never a module inside one."""
    wrong = []
    for file, module, names in _cli_imports():
        if module.startswith("tilestore.cli"):
            continue  # its own modules
        if module not in FACES:
            wrong.append(f"{file}: {module}")
            continue
        offered = set(importlib.import_module(module).__all__)
        wrong += [f"{file}: {module}.{n}" for n in names if n not in offered]
    assert wrong == []


@pytest.mark.parametrize(
    ("module", "not_loaded"),
    [
        ("tilestore.errors", ("zarr", "dask", "xarray", "torch")),
        ("tilestore", ("zarr", "dask", "xarray", "torch")),
        ("tilestore.embed", ("torch", "zarr")),
        ("tilestore.embed.procdecode", ("torch", "zarr", "xarray")),  # each decoder imports it
        ("tilestore.embed.settings", ("torch",)),  # the CLI reads its defaults
        ("tilestore.plan.options", ("torch", "zarr", "dask")),  # so does the plan's
        ("tilestore.qc.options", ("torch",)),  # and QC's
        # the command starts the slide worker before it imports torch; the worker imports it
        ("tilestore.cli.embed", ("torch", "timm")),
        ("tilestore.cli.main", ("torch", "timm")),
        ("tilestore.embed.inputs", ("torch", "timm", "dask", "xarray")),
        # each store process (`tilestore.embed.storeside`) opens and writes stores, no model
        ("tilestore.embed.storeside", ("torch", "timm", "dask", "xarray")),
        ("tilestore.plan.plans", ("torch",)),  # plans read stored QC, never compute it
        ("tilestore.qc.report", ("torch",)),
        # a cohort is built and the learn options checked without torch (the command's start)
        ("tilestore.learn", ("torch",)),
        ("tilestore.learn.options", ("torch",)),
        ("tilestore.learn.cohort", ("torch",)),
        # opening a store imports no conversion code
        ("tilestore.reading.opening", ("tilestore.conversion", "tilestore.conversion.converter")),
        # an embed run writes embeddings and plans from stored masks: reading them back
        # (dask, xarray, pandas) and computing masks (scipy) are loaded only when asked
        ("tilestore.embed.engine", ("dask", "xarray", "pandas", "scipy")),
        ("tilestore.cli.embed", ("dask", "xarray", "pandas", "scipy")),
        # the exports' list and face: the command reads them at start, their writers load
        # when one is called
        ("tilestore.exports", ("zarr", "xarray", "h5py", "tifffile", "matplotlib")),
        ("tilestore.exports.registry", ("zarr", "xarray", "h5py", "tifffile", "matplotlib")),
        # each export's command: its signature read as `tilestore export` is built, its
        # writer's heavy imports inside its functions
        *(
            (f"tilestore.exports.{name}", ("xarray", "h5py", "matplotlib", "pandas", "anndata"))
            for name in ("h5", "h5ad", "heatmap", "maps", "ometiff", "qupath", "slidetable")
        ),
        ("tilestore.cli.export", ("xarray", "h5py", "matplotlib", "pandas", "anndata")),
        # a cohort, its splits and its metrics never need torch (only training does)
        ("tilestore.learn", ("torch", "zarr", "pandas")),
        ("tilestore.learn.cohort", ("torch",)),
        ("tilestore.learn.splits", ("torch",)),
        ("tilestore.learn.metrics", ("torch",)),
    ],
)
def test_light_modules_stay_light(module, not_loaded):
    code = f"import sys, {module}; print(sorted(m for m in {not_loaded!r} if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("package", FACES)
def test_every_public_name_resolves(package):
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    assert set(module.__all__) <= set(dir(module))


def _code_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def test_no_code_of_the_project_imports_the_old_top_level_names():
    """Notebooks, tests and benchmarks import `tilestore.embed` and `tilestore.cli`: a bare
    `embed` once ran in the notebooks only because their test put the source folder first
    on the path (a user's install has none)."""
    old = re.compile(r"^\s*(from|import)\s+(embed|cli)\b", re.M)
    sources = {p: [p.read_text()] for p in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/*.py")]}
    sources |= {p: _code_cells(p) for p in ROOT.glob("notebooks/*.ipynb")}
    found = {
        str(p.relative_to(ROOT)) for p, texts in sources.items() if any(map(old.search, texts))
    }
    assert found <= {"bench/compare.py"}  # it runs base trees from before, as they import


def _classes_and_raises():
    """(file, class name, base names) of every class, and (file, line) of every bare
    `raise TilestoreError(...)`, in the package's code."""
    classes, bare = [], []
    for folder in ("tilestore", "embed", "cli"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                    classes.append((str(path.relative_to(ROOT)), node.name, bases))
                elif (
                    isinstance(node, ast.Raise)
                    and isinstance(node.exc, ast.Call)
                    and getattr(node.exc.func, "id", None) == "TilestoreError"
                ):
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return classes, bare


def test_the_error_hierarchy_lives_in_one_module():
    """Every exception a user may see is a TilestoreError declared in `tilestore.errors`,
    and each problem is raised as the kind it is, never a bare TilestoreError."""
    import tilestore.errors as errors

    ours = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.TilestoreError)
    }
    classes, bare = _classes_and_raises()
    elsewhere = [
        f"{file}: {name}"
        for file, name, bases in classes
        if file != "tilestore/errors.py" and set(bases) & (ours | {"TilestoreError"})
    ]
    assert elsewhere == [] and bare == []


def test_ds_tiles_is_registered_by_a_call_never_by_an_import():
    """Importing the readers registers nothing on xarray; `register_accessor()` (which
    `open_embeddings` calls for what it returns) does, once, for any Dataset."""
    code = (
        "import xarray as xr, tilestore.embeddings, tilestore.embeddings.read, tilestore.analysis\n"
        "before = hasattr(xr.Dataset(), 'tiles')\n"
        "tilestore.analysis.register_accessor(); tilestore.analysis.register_accessor()\n"
        "print(before, type(xr.Dataset().tiles).__name__)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["False", "TilesAccessor"], run.stderr
