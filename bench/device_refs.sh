#!/usr/bin/env bash
# The references' packages for bench/encoders.py on a bare GPU machine, after bench/device.sh:
# the carried wheels (.peers-whl: open_clip_torch, ftfy, wcwidth, einops, fairscale 0.4.13,
# sentencepiece, protobuf, geopandas) into /tmp/refsite, put after /tmp/site and /tmp/this
# on PYTHONPATH: this process's open_clip and MUSK text towers (ours and the references built
# in it: QuiltNet, BiomedCLIP, CONCH's and MUSK's zero-shot) import them too. The reference
# process takes `--reference-path /tmp/refsite:/tmp/site`; the authors' sources, carried in
# .peers/ (TRIDENT, CONCH, MUSK; their commits in .peers/REVISIONS), go as --trident, --conch,
# --musk $ROOT/.peers/NAME. $ROOT: the carried tree (device.sh ends in /tmp/this).
# Usage: ROOT=$PWD; source bench/device.sh; source $ROOT/bench/device_refs.sh
if [ -z "${ROOT:-}" ] || ! compgen -G "$ROOT/.peers-whl/*.whl" >/dev/null; then
    echo "device_refs.sh: ROOT=${ROOT:-} has no .peers-whl/*.whl (set ROOT=\$PWD before device.sh)" >&2
    return 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/refsite "$ROOT"/.peers-whl/*.whl || return 1
export PYTHONPATH=$PYTHONPATH:/tmp/refsite
python3 -c "import open_clip, fairscale, einops, sentencepiece, google.protobuf, geopandas; print('refs: open_clip', open_clip.__version__, 'fairscale', fairscale.__version__, 'protobuf', google.protobuf.__version__)" || return 1
