#!/usr/bin/env bash
# Set up a bare GPU machine for the benchmarks and the GPU tests: the carried wheels (.whl)
# into /tmp/site, and this tree laid out as it installs (embed/ and cli/ inside tilestore/,
# as tilestore.embed and tilestore.cli) in /tmp/this, with its entry points' metadata (zarr
# finds our `jpeg` codec through one); CMU-1-Small-Region from .bench-data/slides (../shared
# does not travel). Ends in /tmp/this.
# Usage: source bench/device.sh
set -e
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
fi
export TILESTORE_DATA=$PWD/.bench-data
rm -rf /tmp/this && mkdir -p /tmp/this
cp -r tilestore tests bench notebooks pyproject.toml README.md /tmp/this/
cp -r embed /tmp/this/tilestore/embed && cp -r cli /tmp/this/tilestore/cli
python3 - <<'PY'
import pathlib, tomllib
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
dist = pathlib.Path("/tmp/this/tilestore-0.1.0.dist-info")
dist.mkdir()
(dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tilestore\nVersion: 0.1.0\n")
(dist / "top_level.txt").write_text("tilestore\n")
groups = {"console_scripts": project["scripts"], **project["entry-points"]}
(dist / "entry_points.txt").write_text(
    "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for g, eps in groups.items())
)
PY
export PYTHONPATH=/tmp/site:/tmp/this
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
cd /tmp/this
python3 -c "import torch, zarr, imagecodecs, tilestore.embed; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.is_available() and torch.cuda.get_device_name(0), 'zarr', zarr.__version__)"
set +e
