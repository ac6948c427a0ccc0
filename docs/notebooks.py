"""The tutorial notebooks, executed at every build so the site shows what they print and draw.

The repository keeps them without outputs (a diff is the code, never a figure); the build
runs each top to bottom in a fresh folder (what a notebook writes stays there, never beside
the sources), against the shared sample data (`TILESTORE_DATA`, else `../shared/data` beside
the repository, as the notebooks themselves default), with the package as installed, and the
site renders the executed copy. A cell that raises fails the build. `TILESTORE_DOCS_EXECUTE=0`
shows them as stored, for a quick look at the pages' text.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600  # a cell; the two tutorials take ~40 s each on a 2-core box
# dask's array repr (dask/widgets/templates/array.html.j2) writes a dtype such as `<U23`
# unescaped into its table, where a browser takes it for a tag and hides it
_DASK_DTYPE = re.compile(r'(<td colspan="2"> )<([A-Za-z]\d+ )')


def enabled() -> bool:
    return os.environ.get("TILESTORE_DOCS_EXECUTE", "1") != "0"


def data_folder() -> Path:
    data = Path(os.environ.get("TILESTORE_DATA") or ROOT.parent / "shared" / "data").resolve()
    if not (data / "slides").is_dir():
        raise FileNotFoundError(
            f"the tutorials read the sample slides in {data / 'slides'}, which is not there: "
            "set TILESTORE_DATA to the data folder, or TILESTORE_DOCS_EXECUTE=0 to show the "
            "notebooks without outputs"
        )
    return data


def execute(source: Path, work: Path, out: Path, data: Path) -> None:
    """`source` run top to bottom in the new folder `work` (what it writes stays there), the
    executed copy written to `out`. A committed output or a cell that raises is an error
    naming the notebook."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(source, as_version=4)
    if any(c.get("outputs") for c in notebook.cells if c.cell_type == "code"):
        raise ValueError(f"{source.name}: commit notebooks without outputs (the build runs them)")
    work.mkdir(parents=True)
    client = NotebookClient(
        notebook,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(work)}},
    )
    client.execute(env={**os.environ, "TILESTORE_DATA": str(data)})
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if isinstance(html := output.get("data", {}).get("text/html"), str):
                output["data"]["text/html"] = _DASK_DTYPE.sub(r"\1&lt;\2", html)
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, out)
