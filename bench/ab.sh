#!/usr/bin/env bash
# A/B on one lent machine: bench/run_process.py for a base tree and this one, one after the
# other, on the same stores (numbers from two calls may come from two machines).
#   git archive <base> tilestore embed cli bench pyproject.toml README.md | tar -x -C .ab
#   mkdir -p .ab/tests .ab/notebooks   # bench/device.sh copies them
#   run: VARIANTS="base this this_sw" bash bench/ab.sh      (carry .whl .bench-data .ab)
# A variant named base* runs the tree in .ab; *_sw* sets the switch interval to 0.5 ms.
ROOT=$PWD
source bench/device.sh >/tmp/setup.log 2>&1
rm -rf /tmp/this_ab && mv /tmp/this /tmp/this_ab
cd "$ROOT/.ab" && source "$ROOT/bench/device.sh" >/tmp/setup-base.log 2>&1
rm -rf /tmp/base && mv /tmp/this /tmp/base && mv /tmp/this_ab /tmp/this
export TILESTORE_DATA=$ROOT/.bench-data
cd /tmp/this && python3 bench/run_process.py prep --work /tmp/ab-stores
for v in ${VARIANTS:-base this}; do
  case $v in base*) T=/tmp/base;; *) T=/tmp/this;; esac
  case $v in *_sw*) SW="--switch 0.0005";; *) SW=;; esac
  (cd $T && PYTHONPATH=/tmp/site:$T python3 /tmp/this/bench/run_process.py run --work /tmp/ab-stores \
     --tag "$v" $SW --out "${OUT:-/tmp}/ab-$v.json" 2>&1 | grep "^| $v ")
done
