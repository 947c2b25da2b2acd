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
# discarded (the GPU run records the compiles itself).
#
# What the pack keeps: a re-run on the same store goes on from the pack there is (its libraries are cache hits) and
# adds to it, so the plans of several GPU calls (the grid's, the LLM shapes') share one pack. The first run on a
# changed store (a GPU session's results committed; the pack notes the store's sha256 in .precompiled/store.sha256)
# keeps only the libraries its own plan looked up or compiled: the others were measured on the GPU already, or were
# planned on a store the plan has outgrown, and the carry is capped (64 MiB with the store and .whl). The compiler
# refreshes an entry's mtime on each hit, so "used" is "newer than this run's start". Remove .precompiled/ to start
# afresh. PRECOMPILED_DIR (default .precompiled) moves the pack. `--strategy cublaslt` decodes the stored cuBLASLt
# algorithms, which needs the cuBLAS headers and library here (CUDAL2_CUBLAS_HOME).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 && $1 =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "usage: bash scripts/precompile.sh MINUTES <cudal2 tune arguments>" >&2; exit 2; }
minutes=$1
shift
store=${GRID_STORE:-benchmarks/stores/h200_grid.sqlite.gz}
packs=${PRECOMPILED_DIR:-.precompiled}
pack=$packs/build.tar.gz
[[ -f $store ]] || { echo "precompile.sh: no store at $store (GRID_STORE)" >&2; exit 2; }
deltas=${store%.gz}; deltas=${deltas%.sqlite}.deltas  # the committed store is a base and its deltas (cudal2 store)
store_sha=$({ sha256sum "$store"; ! compgen -G "$deltas/*.sqlite.gz" >/dev/null || sha256sum "$deltas"/*.sqlite.gz; } \
  | sha256sum | cut -d' ' -f1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build=$work/cache/cudal2/build
python3 -m cudal2.cli store assemble "$store" --out "$work/plan.sqlite" >/dev/null
mkdir -p "$build"
[[ ! -f $pack ]] || tar -xzf "$pack" -C "$build"
touch "$work/started"  # entries newer than this were compiled or served by this run's plan
XDG_CACHE_HOME="$work/cache" python3 -m cudal2.cli tune --compile-only --plan-as "${PLAN_AS:-h200}" \
  --db "$work/plan.sqlite" --budget-minutes "$minutes" "$@" | grep -v '^\[job'
dropped=0
if [[ $(cat "$packs/store.sha256" 2>/dev/null) != "$store_sha" ]]; then
  dropped=$(find "$build" -mindepth 2 -maxdepth 2 -type d ! -newer "$work/started" -print -exec rm -rf {} + | wc -l)
fi
mkdir -p "$packs"
tar -czf "$pack" -C "$build" .
echo "$store_sha" > "$packs/store.sha256"
echo "precompiled: $(find "$build" -name candidate.so | wc -l) libraries," \
     "$(du -h "$pack" | cut -f1) in $pack; $dropped entries the plan did not use dropped"
