#!/usr/bin/env bash
# One call on the GPU device: install carried wheels, run the GPU tests and the benchmarks, write under $OUT.
#   bash scripts/gpu_check.sh [smoke|tests|bench|all]   (default all)
# Carried wheels (.whl/, ignored by git): nvidia-cutlass (headers for CuTe/CUTLASS candidates).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudal2-out}
mkdir -p "$OUT"
what=${1:-all}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/cudal2-cache}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv; nvcc --version | tail -1;
  python3 -c 'import torch; print("torch", torch.__version__)'; git log -1 --format='commit %H %s' 2>/dev/null; } \
  | tee "$OUT/env.txt"
rc=0
if [[ $what == smoke || $what == all ]]; then
  python3 -m cudal2.cli eval kernels/seed/*.cu --mnk 128_128_128 --mnk 1024_1024_1024 --mnk 4096_4096_4096 \
    --db "$OUT/results.sqlite" 2>&1 | tee "$OUT/smoke.log" || rc=1
fi
if [[ $what == tests || $what == all ]]; then
  CUDAL2_CORPUS_TABLE="$OUT/corpus_table.md" python3 -m pytest -m gpu -q --timeout=300 tests -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
if [[ $what == bench || $what == all ]]; then
  python3 benchmarks/eval_bench.py --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" || rc=1
  python3 benchmarks/pool_gpu.py 2>&1 | tee "$OUT/pool_gpu.log" || rc=1
fi
exit $rc
