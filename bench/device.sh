#!/usr/bin/env bash
# Set up a bare GPU machine for the benchmarks: carried wheels (.whl), this package, and
# CMU-1-Small-Region (carried in .bench-data/slides, since ../shared does not travel).
# Usage: source bench/device.sh
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
export TILESTORE_DATA=$PWD/.bench-data
# zarr finds our `jpeg` codec through the package's entry point: give it the metadata
python3 - <<'PY'
import pathlib
site = pathlib.Path("/tmp/site")
dist = site / "tilestore-0.1.0.dist-info"
dist.mkdir(exist_ok=True)
(dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tilestore\nVersion: 0.1.0\n")
(dist / "entry_points.txt").write_text("[zarr.codecs]\njpeg = tilestore.codecs:JpegCodec\n")
PY
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
python3 -c "import torch, zarr, imagecodecs, tilestore, embed; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0), 'zarr', zarr.__version__)"
set +e
