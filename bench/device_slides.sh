#!/usr/bin/env bash
# The slide encoders' references (bench/slide_encoders.py reference) on a bare GPU machine,
# after bench/device.sh and bench/device_refs.sh (TRIDENT's and the authors' imports: einops,
# geopandas): the authors' code travels in .slideref/sources (plain source trees, their
# commits in its REVISIONS; made here by `python bench/slide_encoders.py sources --encoders
# ...`); requests (COBRA's load_cobra imports it, unused offline) and what it needs, where the
# machine lacks it, from .slideref/whl into /tmp/slidesite, after the others on PYTHONPATH
# (made here: pip download --no-deps --only-binary=:all: --python-version 3.12 --platform any
# -d .slideref/whl requests urllib3 charset_normalizer certifi idna);
# then the store the references read, made once: bench/stores.py's SLIDE_SIZE px slide of
# CMU-1 tissue (default 40000) from .bench-data, converted with its tiles copied, in $SLIDES
# (default /tmp/slides) -> $SLIDE_STORE. $ROOT: the carried tree.
# Usage: ROOT=$PWD; source bench/device.sh; source $ROOT/bench/device_refs.sh
#        source $ROOT/bench/device_slides.sh
# then the six in fp32 (each is registered fp32, as its authors run it by default: so
# --precision authors is this same run), and MOOZY in bf16 (the authors' --mixed_precision):
#   R="python3 bench/slide_encoders.py reference --device cuda --store $SLIDE_STORE \
#       --work /tmp/sw --sources $ROOT/.slideref/sources --trident $ROOT/.peers/TRIDENT"
#   $R --encoders moozy,cobra,cobra-conch,cobra-uni,cobra-h-optimus-0,feather-uni
#   $R --encoders moozy --precision bf16
# On this 2-core CPU (--device cpu): set-up and store 25 s; at 20,000 px the six 74 s and
# MOOZY bf16 33 s; at 40,000 px the four COBRA and feather-uni 144 s (COBRA's reference
# 7-59 s each). On a GPU each reference is mostly its process's start: a few minutes in all.
if [ -z "${ROOT:-}" ] || [ ! -f "$ROOT/.slideref/sources/REVISIONS" ]; then
    echo "device_slides.sh: ROOT=${ROOT:-} has no .slideref/sources/REVISIONS (set ROOT=\$PWD before device.sh)" >&2
    return 1
fi
if ! python3 -c "import requests" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/slidesite "$ROOT"/.slideref/whl/*.whl || return 1
    export PYTHONPATH=$PYTHONPATH:/tmp/slidesite
fi
SLIDES=${SLIDES:-/tmp/slides}
SLIDE_SIZE=${SLIDE_SIZE:-40000}
export SLIDE_STORE=$SLIDES/copied/large-$SLIDE_SIZE.ome.zarr
if [ ! -d "$SLIDE_STORE" ]; then
    python3 - "$SLIDES" "$SLIDE_SIZE" <<'PY' || return 1
import sys, time
from pathlib import Path
sys.path.insert(0, "bench")
from stores import build
started = time.perf_counter()
build(Path(sys.argv[1]), int(sys.argv[2]), ())
print(f"slides: {sys.argv[2]} px store made in {time.perf_counter() - started:.0f} s", flush=True)
PY
fi
echo "slides: sources $(awk '{printf "%s %.7s, ", $1, $3}' "$ROOT/.slideref/sources/REVISIONS")store $SLIDE_STORE"
