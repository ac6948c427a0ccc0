"""The notebooks run top to bottom against ../shared/data, with the package as installed (no
source folder on the path), so they never rot; their figures show inline, as a reader sees
them in Jupyter."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import DATA, REPO, real

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path, monkeypatch):
    real(DATA / "slides")
    monkeypatch.setenv("TILESTORE_DATA", str(DATA.resolve()))
    notebook = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in notebook.cells if c.cell_type == "code"), (
        f"{path.name}: commit notebooks without outputs"
    )
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    ).execute()
    pngs = sorted(p.name for p in tmp_path.rglob("*.png"))
    assert pngs, "the notebook saved no figures"
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    drawn = [c for c in notebook.cells if c.cell_type == "code" and _draws(c.source)]
    assert drawn, f"{path.name}: no cell draws a figure"
    for cell in drawn:  # each figure shown where the cell is, not only saved to a file
        shown = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert shown, f"{path.name}: no inline figure from: {cell.source.splitlines()[-1]}"


def _draws(source: str) -> bool:
    last = source.strip().splitlines()[-1] if source.strip() else ""
    return last.startswith(("plot_map(", "plot_gallery(", "plot_hits(", "render_preview("))
