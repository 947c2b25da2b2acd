#!/usr/bin/env bash
# One call on the GPU device: install carried wheels, run the GPU tests and the benchmarks, write under $OUT.
#   bash scripts/gpu_check.sh [smoke|tests|bench|scale|train|family|sm90|host|gap|fence|tiny|fused|lean|profile|paired|model|linear|tune|grid|env|all]   (default all = smoke, tests, bench)
#     env: only the machine's description ($OUT/env.txt: GPU, driver, clocks, nvcc, torch), as every mode writes first
#     host: the GPU tests of sm90's host_cache, then benchmarks/host_overhead.py (host time per call, with and without)
#     gap: benchmarks/graph_gap.cu, the cost of one more kernel, memset or cluster-launch node in graph replay; then
#          benchmarks/cublas_graph.cu, the cuBLAS baseline's graph nodes (kernel names, PDL) on CUBLAS_GRAPH_SHAPES
#     fence: benchmarks/fence_ab.py: the last-arrival and spread kernels with fence.sc.gpu (as rendered) against the same
#            with fence.acq_rel.gpu, FENCE_REPEATS (3) fresh evaluations of each on the script's long-K shapes
#     tiny: benchmarks/tiny_floor.py: 64x64x64's small-family winner against lean kernels that do only that shape,
#           TINY_REPEATS (5) fresh evaluations each: what the family's generality costs at the smallest shape
#     fused: benchmarks/fused_splitk.py: the sm90 family's reduction=last (split-K summed in the GEMM's epilogue by the
#            last K range) against its batch with splitk_reduce, plain and with PDL, on the same tiles,
#            FUSED_REPEATS (2) fresh evaluations each on FUSED_SHAPES
#            (default: the script's few-tile long-K shapes)
#     lean: benchmarks/long_k_lean.py: long-K small-output shapes' H200 winners against lean kernels that stream K
#           through cp.async stages and sum over clusters and workspace groups, LEAN_REPEATS (2) fresh evaluations
#           each on LEAN_SHAPES (default: all the script's shapes)
#     profile: benchmarks/kernel_profile.py under Nsight Compute, the grid store's best kernel (or each config that
#              PROFILE_CONFIGS names) and cuBLAS's on PROFILE_SHAPES (duration, launch, DRAM bytes, instructions, stall
#              reasons per kernel)
#     paired: benchmarks/paired_noise.py on the grid store's chosen kernels of PAIRED_COUNT (24) shapes with
#             MNK >= 2^PAIRED_MIN_LOG2_MNK (36), each timed PAIRED_REPEATS (3) times: paired speedup vs ratio of medians
#     model: patch_linear's GPU test, then benchmarks/model_bench.py: MODEL_BENCH_LAYERS (2) decoder layers of each LLM
#            model (MODEL_BENCH_MODELS, default all) at MODEL_BENCH_TOKENS (1..8192) with their linears on a library
#            exported from GRID_STORE at MODEL_BENCH_MIN_SPEEDUP (1.02), against torch (eager and CUDA graph); once per
#            value of MODEL_BENCH_TWINS ("0"; "0 1": also exported with the sm90 kernels' verified host_cache twins);
#            MODEL_BENCH_COMPILE=1: also both models through torch.compile, captured (--compile); =reduce-overhead:
#            through torch.compile's reduce-overhead mode, timed as called
#     linear: benchmarks/linear_bench.py: the separate bias add's cost against F.linear's fused bias (LINEAR_BENCH_TOKENS,
#             default 1..8192) and the patched nn.Linear forward's host time per call
#     family: the GPU tests of the kernel families, the tuner and cudal2.ops, then the sm90 and ops benchmarks
#     tune: the tuner on a stratified grid sample (TUNE_MINUTES, default 3), then cudal2 report over the store
#     grid: the leaderboard over the 1000-shape grid, spread over calls and sessions: the store travels gzipped in
#           GRID_STORE (default benchmarks/stores/h200_grid.sqlite.gz, committed) and each call goes on from it:
#           TUNE_MINUTES (default 0) of sample tuning, RERENDER_MINUTES (default 0) of `--strategy rerender` on the
#           grid and on the LLM shapes each, NEIGHBOURS_MINUTES (default 0) of `--strategy neighbours` on the
#           NEIGHBOURS_WORST (60) slowest shapes of NEIGHBOURS_SHAPES (data/grid.csv; data/llm_shapes.csv works too)
#           with 2^NEIGHBOURS_MIN_LOG2_MNK (36: the large bucket) <= MNK < 2^NEIGHBOURS_MAX_LOG2_MNK (64) and
#           NEIGHBOURS_MIN_K <= K <= NEIGHBOURS_MAX_K (default: any K), stepping only along the parameters NEIGHBOURS_VARY names
#           (space-separated, e.g. "epi_n"; default: every parameter), from the families NEIGHBOURS_FAMILIES names
#           (e.g. "small sm80_mma"; default all), with NEIGHBOURS_WON_ONLY=1 only on the shapes those families win,
#           after NEIGHBOURS_SEED_MINUTES (default 0) of `--strategy transfer` of those families onto all these shapes
#           (an incumbent of theirs to step from where they never ran),
#           with GIVEN_CONFIGS (files of config names, space-separated, e.g. benchmarks/given/long_k_small.txt) GIVEN_MINUTES (5) of
#           `--strategy given` on GIVEN_SHAPES (data/grid.csv) with 2^GIVEN_MIN_LOG2_MNK (0) <= MNK <
#           2^GIVEN_MAX_LOG2_MNK (64) and GIVEN_MIN_K <= K <= GIVEN_MAX_K (default: any K),
#           CUBLASLT_MINUTES (default 0) of `--strategy cublaslt` on the CUBLASLT_WORST (100) slowest shapes of
#           CUBLASLT_SHAPES (data/grid.csv) with 2^CUBLASLT_MIN_LOG2_MNK (0) <= MNK < 2^CUBLASLT_MAX_LOG2_MNK (64)
#           (with CUBLAS_KERNELS, a cublas_graph.cu report, also nearest to the kernels cuBLAS itself runs),
#           MODEL_MINUTES (default 0) of `--strategy model` on MODEL_SHAPES (data/grid.csv) with
#           2^MODEL_MIN_LOG2_MNK (0) <= MNK < 2^MODEL_MAX_LOG2_MNK (64), only the MODEL_WORST slowest (0: all),
#           (every round with TUNE_RETRY="STATUS ...": `--retry STATUS`, the pairs stored with it measured again),
#           TRANSFER_MINUTES (default 2) of `--strategy transfer` on the shapes TRANSFER_MNK names ("M_N_K ...", default
#           none; with TUNE_RETRY, the way to measure again a stored failure on those shapes),
#           FILL_MINUTES (default 0) of `cudal2 tune --strategy fill`
#           over the grid, then GRID_MINUTES (default 5) of `cudal2 tune --strategy transfer` over it, then WORST_ROUNDS (default 0) rounds of WORST_MINUTES (3) evolutionary search on
#           the grid's WORST_SHAPES (40) slowest shapes each followed by another transfer, LLM_MINUTES (default 0)
#           of transfer onto data/llm_shapes.csv and LLM_FILL_MINUTES (default 0) of fill on them, then REMEASURE=1 (=grid, =FILE) re-times the tuned sample's (the
#           grid's, a shape CSV's) best kernels with MNK < 2^REMEASURE_MAX_LOG2_MNK (default 64; 30: every shape whose offline
#           inputs can sit in L2), with REMEASURE_CHOSEN_ON (e.g. h200) the kernels that GPU's offline results chose, in REMEASURE_MODES (default "server wallclock"; cold too; REMEASURE_MINUTES each, default: to
#           the end; a later call goes on where it stopped; REMEASURE_TWINS=1: the sm90 kernels' host_cache twins instead), CONFIRM=1 the chosen kernels of CONFIRM_SETS (data/grid.csv data/llm_shapes.csv) once more offline (CONFIRM_MINUTES, 6 each;
#           only the shapes with MNK >= 2^CONFIRM_MIN_LOG2_MNK (0); CONFIRM_PAIRED=1: also those whose confirm figure has no
#           paired speedup, and a report by the paired estimator too; RANK=speedup: the kernels chosen by their speedup
#           over cuBLAS instead of their median time, for REMEASURE too)
#           (`remeasure --mode confirm`: free of the search's best-of-N selection); reports (offline grid and LLM shapes,
#           server and wallclock sample) in one archive, and the rows the call added to the store ($OUT/grid_delta.sqlite.gz:
#           `cudal2 store delta --db grid_delta.sqlite.gz --committed GRID_STORE` commits them as GRID_STORE's next delta)
#     scale: the pool on 1 GPU, then on 2 (and 4, 8 where present): evaluations/min and GPU busy per count
#     train: a short GRPO run with the full reward (configs/gpu_tiny.yaml): trainer and pool on GPU 0, then, with
#            two or more GPUs, the trainer on GPU 0 and the pool on the others; step time split per run
# GPU_MUST_BE=H200 (any part of nvidia-smi's GPU name): where the GPU is another, stop before anything is installed
# or run (exit 3, one line); a lent machine may be another kind, and figures for one GPU's store need that GPU.
# An unknown mode stops at once too (exit 2), before the minutes a run would take are spent on nothing.
# Carried precompiled libraries (.precompiled/, ignored by git; scripts/precompile.sh makes them) go into the compile
# cache first. Carried wheels (.whl/, ignored by git): nvidia-cutlass (headers for CuTe/CUTLASS candidates); trl,
# datasets, dill, multiprocess (the device image lacks them; pyarrow, pandas, fsspec, xxhash are there).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudal2-out}
what=${1:-all}
modes=(smoke tests bench scale train family sm90 host gap fence tiny fused lean profile paired model linear tune grid env all)
known=0
for name in "${modes[@]}"; do [[ $name != "$what" ]] || known=1; done
((known)) || { echo "gpu_check.sh: unknown mode '$what' (one of: ${modes[*]})" >&2; exit 2; }
if [[ -n ${GPU_MUST_BE:-} ]]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  [[ -n $gpu && $gpu == *"$GPU_MUST_BE"* ]] || {
    echo "gpu_check.sh: the GPU here is '${gpu:-none found}', not $GPU_MUST_BE (GPU_MUST_BE): nothing run" >&2
    exit 3
  }
fi
mkdir -p "$OUT"  # only now: a refused call leaves nothing behind
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/cudal2-cache}
python3 -c 'from cudal2.sandbox.compiler import cutlass_include_dir as d; raise SystemExit(d() is None)' \
  || echo "note: no CUTLASS/CuTe headers (carry .whl with nvidia-cutlass): sm90 kernels come back internal_error, unstored"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv; nvcc --version | tail -1;
  python3 -c 'import torch; print("torch", torch.__version__)'; git log -1 --format='commit %H %s' 2>/dev/null; } \
  | tee "$OUT/env.txt"
rc=0
# Libraries compiled on a CPU machine for this call (scripts/precompile.sh), carried in .precompiled/: into the cache
# the evaluator reads, which serves each after checking its sha256.
for packed in .precompiled/*.tar.gz; do
  [[ -f $packed ]] || continue
  mkdir -p "$XDG_CACHE_HOME/cudal2/build" && tar -xzf "$packed" -C "$XDG_CACHE_HOME/cudal2/build" \
    && echo "precompiled: $(tar -tzf "$packed" | grep -c 'candidate.so$') libraries from $packed" || rc=1
done
if [[ $what == smoke || $what == all ]]; then
  python3 -m cudal2.cli eval kernels/seed/*.cu --mnk 128_128_128 --mnk 1024_1024_1024 --mnk 4096_4096_4096 \
    --db "$OUT/results.sqlite" 2>&1 | tee "$OUT/smoke.log" || rc=1
fi
if [[ $what == tests || $what == all ]]; then
  # GPU_TESTS (default tests) and GPU_TESTS_K (pytest -k) narrow the run, e.g. to what a change touched.
  # GPU_TESTS_SHARD=i/n runs every n-th of the selected tests from the i-th on: the whole suite takes longer than one
  # device call (an H100 at cbb3a6d: 94 of ~130 tests in 560 s; shard 1/2 at b0fdbe3: 67 tests in 256 s, shard 2/2
  # at 76bef47: 66 tests in 403 s), so run it as 1/2 and 2/2 in two calls. -rs names each skip's reason.
  CUDAL2_CORPUS_TABLE="$OUT/corpus_table.md" CUDAL2_FAILURE_LOG="$OUT/pytest_failures.log" \
    CUDAL2_SHARD="${GPU_TESTS_SHARD:-}" python3 -m pytest -m gpu -q -rfEs --timeout=300 ${GPU_TESTS:-tests} \
    ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
if [[ $what == bench || $what == all ]]; then
  python3 benchmarks/eval_bench.py --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" || rc=1
  python3 benchmarks/pool_gpu.py 2>&1 | tee "$OUT/pool_gpu.log" || rc=1
fi
ngpu=$(nvidia-smi -L | wc -l)
if [[ $what == scale ]]; then
  # Build the harness first, so that its one-off build does not count against the 1-GPU figure.
  python3 -c 'from cudal2.sandbox.gpu import detect_gpu; from cudal2.sandbox.harness_build import harness_path
print(harness_path(detect_gpu(0).compute_capability))' || rc=1
  for n in 1 2 4 8; do
    (( n <= ngpu )) || break
    gpus=$(seq -s, 0 $((n - 1)))
    python3 benchmarks/pool_gpu.py --gpus "$gpus" --json "$OUT/pool_${n}gpu.json" 2>&1 | tee -a "$OUT/pool_scale.log" || rc=1
  done
fi
if [[ $what == train ]]; then
  # Each run gets its own store, so neither answers the other's evaluations from the cache.
  grpo() {  # label, pool GPUs, name
    python3 benchmarks/grpo_gpu.py --label "$1" -- --config configs/gpu_tiny.yaml --pool_gpus "$2" \
      --output_dir "/tmp/runs/$3" --db "/tmp/runs/$3.sqlite" --tiny_path /tmp/runs/tiny-policy \
      --report_to none 2>&1 | tee "$OUT/grpo_$3.log" || rc=1
    cp "/tmp/runs/$3/cudal2_run.json" "$OUT/grpo_$3.json" 2>/dev/null
  }
  mkdir -p /tmp/runs
  grpo "trainer + pool on GPU 0" 0 shared
  (( ngpu >= 2 )) && grpo "trainer GPU 0, pool GPU 1..$((ngpu - 1))" "$(seq -s, 1 $((ngpu - 1)))" split
fi
if [[ $what == family ]]; then
  # The tuner's own GPU test (a 4-minute search) is left to `tune`, which measures the same path.
  timeout "${FAMILY_TIMEOUT:-330}" python3 -m pytest -m gpu -q --timeout=300 tests/kernels -p no:cacheprovider \
    2>&1 | tee "$OUT/pytest_kernels.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  timeout "${OPS_TIMEOUT:-240}" python3 -m pytest -m gpu -q --timeout=200 tests/test_ops.py -p no:cacheprovider \
    2>&1 | tee "$OUT/pytest_ops.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
if [[ $what == gap ]]; then  # what a graph node costs in offline timing (benchmarks/graph_gap.cu)
  nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/graph_gap benchmarks/graph_gap.cu && /tmp/graph_gap | tee "$OUT/graph_gap.txt" \
    || rc=1
  # what the cuBLAS baseline puts in the offline graph (benchmarks/cublas_graph.cu): kernels, PDL, on CUBLAS_GRAPH_SHAPES
  nvcc -O2 -std=c++17 -arch=sm_90a -o /tmp/cublas_graph benchmarks/cublas_graph.cu -lcublas -lcuda \
    && /tmp/cublas_graph ${CUBLAS_GRAPH_SHAPES:-64x64x64 1024x512x256 1024x1024x128 256x2048x1024 128x128x16384 \
       256x64x16384 256x12288x2048 4096x4096x4096 16384x2048x12288} | tee "$OUT/cublas_graph.txt" || rc=1
fi
if [[ $what == fence ]]; then  # the protocols' fence flavour in the rendered kernels (benchmarks/fence_ab.py)
  python3 benchmarks/fence_ab.py --repeats "${FENCE_REPEATS:-3}" --json "$OUT/fence_ab.json" 2>&1 \
    | tee "$OUT/fence_ab.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
if [[ $what == tiny ]]; then  # the small family's 64^3 winner against lean kernels that do only that shape
  python3 benchmarks/tiny_floor.py --repeats "${TINY_REPEATS:-5}" --json "$OUT/tiny_floor.json" 2>&1 \
    | tee "$OUT/tiny_floor.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
if [[ $what == fused ]]; then  # split-K summed in the GEMM's epilogue against the family's batch split-K
  fused_shapes=()
  [[ -z ${FUSED_SHAPES:-} ]] || fused_shapes=(--shapes $FUSED_SHAPES)
  python3 benchmarks/fused_splitk.py --repeats "${FUSED_REPEATS:-2}" "${fused_shapes[@]}" \
    --json "$OUT/fused_splitk.json" 2>&1 | tee "$OUT/fused_splitk.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
if [[ $what == lean ]]; then  # long K on a small output: the winners against lean cp.async + cluster-sum kernels
  lean_shapes=()
  [[ -z ${LEAN_SHAPES:-} ]] || lean_shapes=(--shapes $LEAN_SHAPES)
  python3 benchmarks/long_k_lean.py --repeats "${LEAN_REPEATS:-2}" "${lean_shapes[@]}" \
    --json "$OUT/long_k_lean.json" 2>&1 | tee "$OUT/long_k_lean.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
if [[ $what == profile ]]; then  # Nsight Compute: the grid store's best kernel next to cuBLAS on PROFILE_SHAPES
  store=${GRID_STORE:-benchmarks/stores/h200_grid.sqlite.gz}
  [[ -f /tmp/grid.sqlite ]] || python3 -m cudal2.cli store assemble "$store" --out /tmp/grid.sqlite || rc=1
  profile_configs=()  # PROFILE_CONFIGS: config names to profile on every shape instead of the store's best
  for name in ${PROFILE_CONFIGS:-}; do profile_configs+=(--config "$name"); done
  python3 benchmarks/kernel_profile.py --db /tmp/grid.sqlite --out "$OUT/kernel_profile.md" --raw /tmp/profile-raw \
    ${profile_configs[@]+"${profile_configs[@]}"} --shapes ${PROFILE_SHAPES:-1024x512x256 512x1024x256 256x2048x1024 1024x1024x128 128x4096x256 512x2048x64 \
      128x128x16384 256x12288x4096 12288x8192x4096 64x64x64 4096x4096x4096} 2>&1 | tee "$OUT/kernel_profile.log" || rc=1
  tar -czf "$OUT/kernel_profile_raw.tar.gz" -C /tmp/profile-raw . 2>/dev/null
fi
if [[ $what == paired ]]; then  # the paired speedup against the ratio of medians, on the grid store's chosen kernels
  store=${GRID_STORE:-benchmarks/stores/h200_grid.sqlite.gz}
  python3 benchmarks/paired_noise.py --db "$store" --count "${PAIRED_COUNT:-24}" --repeats "${PAIRED_REPEATS:-3}" \
    --min-log2-mnk "${PAIRED_MIN_LOG2_MNK:-36}" --json "$OUT/paired_noise.json" 2>&1 | tee "$OUT/paired_noise.log" || rc=1
fi
if [[ $what == model ]]; then  # decoder layers of the LLM models with their linears on cudal2.ops, against torch
  store=${GRID_STORE:-benchmarks/stores/h200_grid.sqlite.gz}
  [[ -f /tmp/grid.sqlite ]] || python3 -m cudal2.cli store assemble "$store" --out /tmp/grid.sqlite || rc=1
  if [[ ${MODEL_TESTS:-1} != 0 ]]; then  # patch_linear's GPU test first (MODEL_TESTS=0 skips it)
    python3 -m pytest -m gpu -q --timeout=300 tests/test_ops.py -k patch_linear -p no:cacheprovider 2>&1 \
      | tee "$OUT/pytest_patch_linear.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  fi
  for twins in ${MODEL_BENCH_TWINS:-0}; do  # "0 1": the library as exported, then with host_cache twins
    name=model_bench$([[ $twins == 1 ]] && echo _twins)
    timeout "${MODEL_BENCH_TIMEOUT:-420}" python3 benchmarks/model_bench.py --db /tmp/grid.sqlite \
      --min-speedup "${MODEL_BENCH_MIN_SPEEDUP:-1.02}" --layers "${MODEL_BENCH_LAYERS:-2}" \
      ${MODEL_BENCH_MODELS:+--models "$MODEL_BENCH_MODELS"} ${MODEL_BENCH_TOKENS:+--tokens "$MODEL_BENCH_TOKENS"} \
      ${MODEL_BENCH_EAGER_MIN_SAVING_US:+--eager-min-saving-us "$MODEL_BENCH_EAGER_MIN_SAVING_US"} \
      $([[ ${MODEL_BENCH_COMPILE:-0} == 1 ]] && echo --compile) \
      $([[ ${MODEL_BENCH_COMPILE:-0} == reduce-overhead ]] && echo --compile reduce-overhead) \
      $([[ $twins == 1 ]] && echo --host-cache-twins) --out "$OUT/$name.json" 2>&1 | tee "$OUT/$name.md" || rc=1
  done
fi
if [[ $what == linear ]]; then  # the bias add and the patched forward's host time (benchmarks/linear_bench.py)
  timeout "${LINEAR_BENCH_TIMEOUT:-240}" python3 benchmarks/linear_bench.py \
    ${LINEAR_BENCH_TOKENS:+--tokens "$LINEAR_BENCH_TOKENS"} --out "$OUT/linear_bench.json" 2>&1 \
    | tee "$OUT/linear_bench.md" || rc=1
fi
if [[ $what == sm90 ]]; then
  python3 benchmarks/sm90_gpu.py --json "$OUT/sm90.json" 2>&1 | tee "$OUT/sm90.log" || rc=1
fi
if [[ $what == host ]]; then  # sm90 host_cache: its GPU tests (HOST_TESTS=0 skips them), then the host time per call
  if [[ ${HOST_TESTS:-1} != 0 ]]; then
    python3 -m pytest -m gpu -q --timeout=300 tests/kernels/test_sm90.py -k host_cache -p no:cacheprovider 2>&1 \
      | tee "$OUT/pytest_host_cache.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  fi
  python3 benchmarks/host_overhead.py --out "$OUT/host_overhead.json" 2>&1 | tee "$OUT/host_overhead.md" || rc=1
fi
if [[ $what == tune ]]; then
  # At most 8 files come back from the device: logs and the store as files, the rest in one archive.
  mkdir -p /tmp/tune-out
  python3 benchmarks/tune_gpu.py --budget-minutes "${TUNE_MINUTES:-3}" --per-bucket "${TUNE_PER_BUCKET:-6}" \
    --db "$OUT/tune.sqlite" --out /tmp/tune-out/tune_gpu.md 2>&1 | tee "$OUT/tune.log" || rc=1
  for set in data/grid.csv data/llm_shapes.csv; do
    name=$(basename "$set" .csv)
    python3 -m cudal2.cli report --shapes "$set" --db "$OUT/tune.sqlite" --out "/tmp/tune-out/report_$name.md" \
      --heatmap "/tmp/tune-out/heatmap_$name.png" >/dev/null 2>&1 || echo "report $name: exit $?"
  done
  # cudal2.ops over the best kernel the tuner verified per shape (dispatch then picks those that beat cuBLAS).
  timeout "${OPS_BENCH_TIMEOUT:-180}" python3 benchmarks/ops_bench.py --db "$OUT/tune.sqlite" --min-speedup 0 \
    --out /tmp/tune-out/ops_bench.json 2>&1 | tee "$OUT/ops_bench.log" || rc=1
  tar -czf "$OUT/tune_reports.tar.gz" -C /tmp/tune-out .
fi
if [[ $what == grid ]]; then
  store=${GRID_STORE:-benchmarks/stores/h200_grid.sqlite.gz}
  db=/tmp/grid.sqlite
  mkdir -p /tmp/grid-out
  # a warm machine keeps its own copy; the committed store is a base and its deltas (cudal2 store)
  [[ -f $db || ! -f $store ]] || python3 -m cudal2.cli store assemble "$store" --out "$db" || rc=1
  if [[ ${TUNE_MINUTES:-0} != 0 ]]; then
    python3 benchmarks/tune_gpu.py --budget-minutes "$TUNE_MINUTES" --per-bucket "${TUNE_PER_BUCKET:-6}" \
      --target-ms "${GRID_TARGET_MS:-20}" --db "$db" --out /tmp/grid-out/tune_gpu.md 2>&1 | tee "$OUT/tune.log" \
      | grep -v '^\[job' || rc=1
  fi
  retry_args=()  # TUNE_RETRY="rejected_behaviour ...": every round measures pairs stored with these statuses again
  for status in ${TUNE_RETRY:-}; do retry_args+=(--retry "$status"); done
  grid_tune() {  # extra cudal2 tune arguments; the log keeps every round's summary, not its per-job lines
    python3 -m cudal2.cli tune --target-ms "${GRID_TARGET_MS:-20}" --db "$db" "${retry_args[@]}" "$@" \
      > /tmp/grid-out/round.log 2>&1 || rc=1
    { echo "== cudal2 tune $*"; grep -v '^\[job\|^|' /tmp/grid-out/round.log; } | tee -a "$OUT/grid.log"
  }
  if [[ ${RERENDER_MINUTES:-0} != 0 ]]; then  # configs whose family code changed: today's render, where it was close
    for set in data/grid.csv data/llm_shapes.csv; do
      grid_tune --shapes "$set" --strategy rerender --budget-minutes "$RERENDER_MINUTES"
    done
  fi
  mnk_subset() {  # shapes CSV, min log2 MNK, max log2 MNK (exclusive), output CSV[, max K[, min K]]: the header, rows in range
    awk -F, -v lo="$2" -v hi="$3" -v kmax="${5:-0}" -v kmin="${6:-0}" \
      'NR == 1 || ($1 * $2 * $3 >= 2 ^ lo && $1 * $2 * $3 < 2 ^ hi && (kmax == 0 || $3 <= kmax) && $3 >= kmin)' "$1" > "$4"
  }
  if [[ ${NEIGHBOURS_MINUTES:-0} != 0 ]]; then  # one coordinate step from the fastest config of the worst big shapes
    mnk_subset "${NEIGHBOURS_SHAPES:-data/grid.csv}" "${NEIGHBOURS_MIN_LOG2_MNK:-36}" "${NEIGHBOURS_MAX_LOG2_MNK:-64}" \
      /tmp/grid-out/neighbours.csv "${NEIGHBOURS_MAX_K:-0}" "${NEIGHBOURS_MIN_K:-0}"
    families=()
    for family in ${NEIGHBOURS_FAMILIES:-}; do families+=(--family "$family"); done
    if [[ ${NEIGHBOURS_SEED_MINUTES:-0} != 0 ]]; then  # an incumbent of these families on shapes they never ran
      grid_tune --shapes /tmp/grid-out/neighbours.csv --strategy transfer --budget-minutes "$NEIGHBOURS_SEED_MINUTES" \
        "${families[@]}"
    fi
    step=("${families[@]}")  # what a step may change, from which families, on which shapes
    for param in ${NEIGHBOURS_VARY:-}; do step+=(--vary "$param"); done
    [[ ${NEIGHBOURS_WON_ONLY:-0} == 0 ]] || step+=(--won-only)
    grid_tune --shapes /tmp/grid-out/neighbours.csv --worst "${NEIGHBOURS_WORST:-60}" --strategy neighbours \
      --budget-minutes "$NEIGHBOURS_MINUTES" "${step[@]}"
  fi
  if [[ -n ${GIVEN_CONFIGS:-} ]]; then  # configs listed by hand (benchmarks/given/*.txt) on a range of shapes
    mnk_subset "${GIVEN_SHAPES:-data/grid.csv}" "${GIVEN_MIN_LOG2_MNK:-0}" "${GIVEN_MAX_LOG2_MNK:-64}" \
      /tmp/grid-out/given.csv "${GIVEN_MAX_K:-0}" "${GIVEN_MIN_K:-0}"
    # shellcheck disable=SC2086  # GIVEN_CONFIGS: one file or several, space-separated
    grid_tune --shapes /tmp/grid-out/given.csv --strategy given --configs $GIVEN_CONFIGS \
      --budget-minutes "${GIVEN_MINUTES:-5}" --max-configs 1000
  fi
  if [[ ${CUBLASLT_MINUTES:-0} != 0 ]]; then  # the configs nearest to cuBLASLt's own choice, where we lose most
    mnk_subset "${CUBLASLT_SHAPES:-data/grid.csv}" "${CUBLASLT_MIN_LOG2_MNK:-0}" "${CUBLASLT_MAX_LOG2_MNK:-64}" \
      /tmp/grid-out/cublaslt.csv
    # CUBLAS_KERNELS: cublas_graph.cu's report (gap's cublas_graph.txt): cuBLAS's own kernels are followed too
    grid_tune --shapes /tmp/grid-out/cublaslt.csv --worst "${CUBLASLT_WORST:-100}" --strategy cublaslt \
      --budget-minutes "$CUBLASLT_MINUTES" ${CUBLAS_KERNELS:+--cublas-kernels "$CUBLAS_KERNELS"}
  fi
  if [[ -n ${TRANSFER_MNK:-} ]]; then  # named shapes: the store's winners on their neighbours
    mnk_args=()
    for mnk in $TRANSFER_MNK; do mnk_args+=(--mnk "$mnk"); done
    grid_tune "${mnk_args[@]}" --strategy transfer --budget-minutes "${TRANSFER_MINUTES:-2}"
  fi
  if [[ ${MODEL_MINUTES:-0} != 0 ]]; then  # the configs the cost model fitted on the store predicts fastest
    mnk_subset "${MODEL_SHAPES:-data/grid.csv}" "${MODEL_MIN_LOG2_MNK:-0}" "${MODEL_MAX_LOG2_MNK:-64}" \
      /tmp/grid-out/model.csv
    grid_tune --shapes /tmp/grid-out/model.csv --worst "${MODEL_WORST:-0}" --strategy model \
      --budget-minutes "$MODEL_MINUTES"
  fi
  if [[ ${FILL_MINUTES:-0} != 0 ]]; then  # the store's winners re-cut (tile, split-K) to fill the SMs
    grid_tune --shapes data/grid.csv --strategy fill --budget-minutes "$FILL_MINUTES"
  fi
  if [[ ${GRID_MINUTES:-5} != 0 ]]; then
    grid_tune --shapes data/grid.csv --strategy transfer --budget-minutes "${GRID_MINUTES:-5}"
    for ((round = 1; round <= ${WORST_ROUNDS:-0}; round++)); do
      grid_tune --shapes data/grid.csv --worst "${WORST_SHAPES:-40}" --strategy evolutionary \
        --budget-minutes "${WORST_MINUTES:-3}" --seed "$round"
      grid_tune --shapes data/grid.csv --strategy transfer --budget-minutes "${GRID_MINUTES:-5}"
    done
  fi
  if [[ ${LLM_MINUTES:-0} != 0 ]]; then  # the LLM shapes borrow from every shape the store has measured
    grid_tune --shapes data/llm_shapes.csv --strategy transfer --budget-minutes "$LLM_MINUTES"
  fi
  if [[ ${LLM_FILL_MINUTES:-0} != 0 ]]; then
    grid_tune --shapes data/llm_shapes.csv --strategy fill --budget-minutes "$LLM_FILL_MINUTES"
  fi
  rank=${RANK:-time}  # how remeasure and its reports choose each shape's kernel (cudal2 report --help: --rank)
  if [[ ${REMEASURE:-0} != 0 ]]; then  # REMEASURE=1: the tuned sample; =grid: all 1000 shapes; =FILE: that shape CSV
    sample=/tmp/grid-out/sample.csv
    python3 -c 'import sys; sys.path.insert(0, "benchmarks"); from tune_gpu import stratified_sample
keep = {f"{t.m},{t.n},{t.k}," for t in stratified_sample(int(sys.argv[1]))}
lines = open("data/grid.csv").read().splitlines()
print("\n".join([lines[0]] + [x for x in lines[1:] if any(x.startswith(k) for k in keep)]))' \
      "${TUNE_PER_BUCKET:-6}" > "$sample"
    [[ $REMEASURE != grid ]] || sample=data/grid.csv
    [[ ! -f $REMEASURE ]] || sample=$REMEASURE
    label=$(basename "${REMEASURE%.csv}")  # names the reports: 1, grid or the CSV's name
    for mode in ${REMEASURE_MODES:-server wallclock}; do
      # Another GPU's kernels have no offline figure here: a report in another mode sets them against confirm's.
      against=()
      [[ -z ${REMEASURE_CHOSEN_ON:-} || $mode == confirm || " ${REMEASURE_MODES:-} " != *" confirm "* ]] \
        || against=(--against confirm)
      python3 -m cudal2.cli remeasure --shapes "$sample" --mode "$mode" --db "$db" --target-ms 20 \
        ${REMEASURE_MINUTES:+--budget-minutes "$REMEASURE_MINUTES"} ${REMEASURE_TWINS:+--host-cache-twins} --rank "$rank" \
        --max-log2-mnk "${REMEASURE_MAX_LOG2_MNK:-64}" ${REMEASURE_CHOSEN_ON:+--chosen-on "$REMEASURE_CHOSEN_ON"} \
        2>&1 | tail -n 5 | tee -a "$OUT/remeasure.log" || rc=1
      python3 -m cudal2.cli report --shapes "$sample" --mode "$mode" --db "$db" --out "/tmp/grid-out/report_${label}_$mode.md" \
        ${REMEASURE_TWINS:+--host-cache-twins} --rank "$rank" ${REMEASURE_CHOSEN_ON:+--chosen-on "$REMEASURE_CHOSEN_ON"} \
        "${against[@]}" >/dev/null 2>&1 || echo "report sample $mode: exit $?"
    done
    python3 -m cudal2.cli report --shapes "$sample" --db "$db" --out "/tmp/grid-out/report_${label}_offline.md" \
      >/dev/null 2>&1
  fi
  if [[ ${CONFIRM:-0} != 0 ]]; then  # each shape's chosen kernel timed once more, offline, in a new evaluation
    for set in ${CONFIRM_SETS:-data/grid.csv data/llm_shapes.csv}; do
      name=$(basename "$set" .csv)
      python3 -m cudal2.cli remeasure --shapes "$set" --mode confirm --db "$db" --target-ms 20 \
        --budget-minutes "${CONFIRM_MINUTES:-6}" --min-log2-mnk "${CONFIRM_MIN_LOG2_MNK:-0}" \
        ${CONFIRM_PAIRED:+--paired} --rank "$rank" 2>&1 | tail -n 5 | tee -a "$OUT/remeasure.log" || rc=1
      for estimator in ratio ${CONFIRM_PAIRED:+paired}; do
        python3 -m cudal2.cli report --shapes "$set" --mode confirm --estimator "$estimator" --db "$db" --rank "$rank" \
          --out "/tmp/grid-out/report_${name}_confirm${CONFIRM_PAIRED:+_$estimator}.md" >/dev/null 2>&1 \
          || echo "report $name confirm $estimator: exit $?"
      done
    done
  fi
  for set in data/grid.csv data/llm_shapes.csv; do
    name=$(basename "$set" .csv)
    python3 -m cudal2.cli report --shapes "$set" --db "$db" --out "/tmp/grid-out/report_$name.md" \
      --heatmap "/tmp/grid-out/heatmap_$name.png" >/dev/null 2>&1 || echo "report $name: exit $?"
  done
  head -n 40 /tmp/grid-out/report_grid.md
  tar -czf "$OUT/grid_reports.tar.gz" -C /tmp/grid-out .
  # Only the rows this machine added to the committed store come back (a few hundred KiB where the whole store is
  # 37 MiB gzipped); `cudal2 store delta --db grid_delta.sqlite.gz --committed GRID_STORE` adds them as its next delta.
  python3 -m cudal2.cli store delta --db "$db" --committed "$store" --out "$OUT/grid_delta.sqlite.gz" || rc=1
fi
exit $rc
