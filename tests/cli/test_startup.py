"""What a `tilestore embed` process loads, up to its end: what its run needs, never the
libraries of other commands or other model families. Each costs a fresh process its import,
and where bytecode is not cached its compilation, before the first batch
(`bench/startup.py`); a function that imports one where it is called, on the run's path,
would not show in the module-level checks of tests/test_architecture.py."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import CMU

# reading results back, exports, the viewer, QC and masks (the slide worker's, not this
# process's), Dask, other model families, other slide readers
UNNEEDED = (
    "anndata",
    "dask",
    "distributed",
    "h5py",
    "matplotlib",
    "open_clip",
    "openslide",
    "pandas",
    "pyarrow",
    "scipy",
    "skimage",
    "sklearn",
    "starlette",
    "transformers",
    "uvicorn",
    "wsidicom",
    "xarray",
)

# `tilestore ARGV` in this process (its _main: main ends the process at once), then the
# names of UNNEEDED it has loaded
DRIVER = """
import json, sys
from tilestore.cli.main import _main
argv, unneeded = json.loads(sys.stdin.read())
sys.argv = ["tilestore", *argv]
try:
    _main()
except SystemExit as done:
    assert done.code in (0, None), done.code
print(json.dumps(sorted(m for m in unneeded if m in sys.modules)))
"""


def test_an_embed_run_from_a_slide_file_loads_only_what_it_needs(tmp_path, slide_path):
    argv = ["embed", slide_path(CMU), "--into", tmp_path, "--model", "efficientnet-lite0",
            "--mpp", "1", "--device", "cpu"]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps([[str(a) for a in argv], UNNEEDED]),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "11 tiles in" in run.stdout
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []
