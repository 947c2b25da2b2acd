#!/usr/bin/env bash
# Compile, on this CPU machine, the configs the next GPU call's `cudal2 tune` will propose first, so that the device
# spends its minutes measuring instead of compiling (an sm90 config takes ~50 s of one core to compile; the H200's
# call compiles on 16 cores, ~3 s a config, and that bounds a tuning round there).
#
#   bash scripts/precompile.sh MINUTES <cudal2 tune arguments of the GPU run: --shapes ... --worst N --strategy S>
#   e.g. bash scripts/precompile.sh 40 --shapes data/grid.csv --worst 100 --strategy cublaslt
#
# It plans on a copy of the committed store (GRID_STORE) as a run on PLAN_AS (h200) would: `cudal2 tune --compile-only
# --plan-as`, the same worst shapes, warm start and cuBLASLt algorithms, in the same order. The compile cache it fills
# goes to .precompiled/build.tar.gz (git-ignored): carry it with `.whl`, and `scripts/gpu_check.sh` unpacks it into
# the device's cache. Cache keys hold the nvcc version and CUTLASS's version marker, not paths: a library built here
# is served there only for the same nvcc and CUTLASS, and is checked against its sha256 first. The store copy is
# discarded (the GPU run records the compiles itself). A re-run goes on from the pack there is (its libraries are
# cache hits) and adds to it; remove .precompiled/ to start afresh. `--strategy cublaslt` decodes the stored cuBLASLt
# algorithms, which needs the cuBLAS headers and library here (CUDAL2_CUBLAS_HOME).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 && $1 =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "usage: bash scripts/precompile.sh MINUTES <cudal2 tune arguments>" >&2; exit 2; }
minutes=$1
shift
store=${GRID_STORE:-benchmarks/stores/h200_grid.sqlite.gz}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gunzip -c "$store" > "$work/plan.sqlite"
mkdir -p "$work/cache/cudal2/build"
[[ ! -f .precompiled/build.tar.gz ]] || tar -xzf .precompiled/build.tar.gz -C "$work/cache/cudal2/build"
XDG_CACHE_HOME="$work/cache" python3 -m cudal2.cli tune --compile-only --plan-as "${PLAN_AS:-h200}" \
  --db "$work/plan.sqlite" --budget-minutes "$minutes" "$@" | grep -v '^\[job'
mkdir -p .precompiled
tar -czf .precompiled/build.tar.gz -C "$work/cache/cudal2/build" .
echo "precompiled: $(find "$work/cache/cudal2/build" -name candidate.so | wc -l) libraries," \
     "$(du -h .precompiled/build.tar.gz | cut -f1) in .precompiled/build.tar.gz"
