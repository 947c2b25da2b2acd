"""End to end (GPU): decoder layers of the LLM shapes' models with their linear layers on cudal2.ops, against the
same layers on torch, at each token count.

    python3 benchmarks/model_bench.py (--library DIR | --db PATH [--min-speedup 1.02] [--host-cache-twins])
                                      [--layers 2] [--models Llama-3-8B,Qwen2.5-7B] [--tokens 1,16,128]
                                      [--compile [default|reduce-overhead]] [--out model_bench.json]

The leaderboard times each GEMM alone, on cold inputs (offline mode rotates input sets past L2); this times what a
user of `cudal2.ops.patch_linear` gets in a model: the GEMMs between the model's own norms, attention and
activations, with its weights as they fall in L2, and the library's dispatch rule (`cudal2.ops.explain`) deciding
per shape.

Per model of cudal2.data.LLM_MODELS (one per distinct set of linear shapes: Mistral-7B's are Llama-3-8B's), a
transformers base model built from its published dims (Qwen2.5 as Qwen2Model: q/k/v with bias; the others as
LlamaModel, whose linear layers and attention match theirs at these lengths) with `--layers` decoder layers and
random float16 weights (std 0.02), no embedding lookup or LM head: inputs_embeds [1, M, hidden] in, the last
hidden state out, no KV cache, SDPA attention. M = 1 and 16 are therefore a forward over M tokens, not a decode
step over a cache: the linear layers' shapes are a decode step's, the attention is cheaper.

Each (model, M) is timed with torch's nn.Linear and on a copy of the model with every linear patched
(`cudal2.ops.patch_linear`, the library's default min_speedup 1.0; `--eager-min-saving-us`, default
cudal2.ops.EAGER_MIN_SAVING_US: an eager call takes a kernel only where it saves that much per call), two ways, or
three with --compile:
    eager: back-to-back forwards from Python, CUDA-event timed (Python, dispatch and launches included)
    graph: one forward captured in a CUDA graph per side, replayed (launch overhead gone: the GPU's time)
    compiled: each model through torch.compile (the first calls of each M compile, outside the timing); in its
           default mode each forward is then captured in a CUDA graph as above, in reduce-overhead mode it is timed
           as called (torch.compile records and replays CUDA graphs itself: what a user of that mode gets)
each as ROUNDS alternating timings (torch, cudal2, torch, ...): the speedup is the median over rounds of
torch_r / cudal2_r, so a drift of the GPU or the host between rounds cancels, and torch's spread over the rounds
is the noise floor. The two captured outputs are compared (relative Frobenius difference). "routes" counts the 7
projections by the path `explain` gives them, a bias included (exact kernel / padded / torch); "GEMM us saved,
predicted" is, over the layers, the exact routes' `ops.saving_us` from the library's manifest (torch.matmul's
offline median less the kernel's, less a bias's separate add), against the graph's measured saving. Prints
markdown; --out writes JSON. A few minutes on an H200; the kernels of the shapes the models meet are compiled
first, in parallel, where the build cache lacks them.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from ops_bench import TARGET_MS, capture, export_from, geomean

from cudal2 import ops
from cudal2.data import LLM_MODELS, TOKEN_COUNTS, ModelConfig, parse_token_counts
from cudal2.export import ExportError, Manifest, ManifestError
from cudal2.sandbox.evaluator import default_cache_dir
from cudal2.sandbox.gpu import detect_gpu
from cudal2.sandbox.store import StoreError

INIT_STD = 0.02  # the published configs' initializer_range
ROUNDS = 5  # alternating timings of torch and cudal2 per (model, M) and way
WARM_CALLS = 3  # reduce-overhead mode: a warm-up call, the call that records its CUDA graph, a replay


@dataclass(frozen=True)
class Paired:
    """One way of running a forward, torch's nn.Linear against the patched layers: medians over ROUNDS (us per
    forward) and the paired speedup, the median over rounds r of torch_r / op_r; all None where it could not run
    (error says why)."""

    torch_us: float | None
    op_us: float | None
    speedup: float | None
    spread: float | None  # (max - min) / median of torch's times over the rounds: the noise floor
    error: str = ""

    @classmethod
    def of(cls, torch_us: list[float], op_us: list[float]) -> Paired:
        med = statistics.median
        return cls(med(torch_us), med(op_us), med(t / o for t, o in zip(torch_us, op_us, strict=True)),
                   (max(torch_us) - min(torch_us)) / med(torch_us))

    @classmethod
    def failed(cls, e: Exception) -> Paired:
        return cls(None, None, None, None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")


@dataclass(frozen=True)
class Row:
    model: str
    tokens: int  # M
    layers: int
    exact: int  # of the 7 projections, how many take an exported kernel for their own shape
    padded: int
    torch: int
    predicted_saving_us: float  # per forward, from the manifest (exact routes; a bias's separate add deducted)
    eager: Paired
    graph: Paired  # one forward captured in a CUDA graph per side
    rel_diff: float | None  # ||patched - torch|| / ||torch|| of the captured last hidden states (None: not captured)
    compiled: Paired | None = None  # torch.compile'd forwards (--compile)
    compiled_rel_diff: float | None = None
    compile_mode: str = ""  # torch.compile's mode: default (captured here) or reduce-overhead (timed as called)


def distinct_models(names: list[str] | None) -> list[ModelConfig]:
    """LLM_MODELS named (all by default), dropping a model whose linear shapes an earlier one has."""
    known = {m.name: m for m in LLM_MODELS}
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise SystemExit(f"model_bench: unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    chosen, seen = [], set()
    for m in LLM_MODELS if not names else [known[n] for n in names]:
        if m.linears() not in seen:
            seen.add(m.linears())
            chosen.append(m)
    return chosen


def build(model: ModelConfig, layers: int, max_tokens: int, device: str = "cuda") -> torch.nn.Module:
    """The base model (decoder layers and final norm) with `model`'s dims, float16 on `device`."""
    import transformers

    common = dict(hidden_size=model.hidden, intermediate_size=model.intermediate,
                  num_attention_heads=model.heads, num_key_value_heads=model.kv_heads, num_hidden_layers=layers,
                  vocab_size=256, max_position_embeddings=max(max_tokens, 2), initializer_range=INIT_STD,
                  attn_implementation="sdpa", use_cache=False)
    if model.qkv_bias:  # Qwen2's architecture (q/k/v with bias); head_dim = hidden / heads in both Qwen2.5 configs
        assert model.hidden == model.heads * model.head_dim, model
        config, cls = transformers.Qwen2Config(**common), transformers.Qwen2Model
    else:
        config, cls = transformers.LlamaConfig(head_dim=model.head_dim, **common), transformers.LlamaModel
    torch.manual_seed(0)
    with torch.device(device):  # weights initialised where they live: seconds, not minutes, for Llama-3-70B
        return cls(config).to(torch.float16).eval()


def routes(layer: torch.nn.Module, tokens: int) -> tuple[dict[ops.Route, int], float]:
    """How many of a decoder layer's linear projections take each route at M = tokens (with their bias, if any),
    and the GPU time the exact ones save per call of the layer by the manifest (us)."""
    counts = dict.fromkeys(ops.Route, 0)
    saving = 0.0
    for proj in layer.modules():
        if isinstance(proj, torch.nn.Linear):
            d = ops.explain(tokens, proj.out_features, proj.in_features, bias=proj.bias is not None)
            counts[d.route] += 1
            if d.route is ops.Route.EXACT:
                saving += ops.saving_us(d)
    return counts, saving


def prebuild(library: Path, shapes: set[tuple[int, int, int]], jobs: int) -> list[str]:
    """Compile the library's kernels for `shapes` `jobs` at a time into the build cache, which then serves each
    kernel's first call (cudal2.ops builds one at a time, on first use). Returns the failures, one line each."""
    manifest, arch = Manifest.load(library), detect_gpu().arch
    entries = {e.source_hash: e for e in manifest.kernels if (e.m, e.n, e.k) in shapes}  # one build per source
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # nvcc runs in child processes: threads suffice
        built = list(pool.map(lambda e: ops.compile_kernel(library / e.file, e.source_hash, arch,
                                                           default_cache_dir()), entries.values()))
    return [f"{e.file}: {b.reason}" for e, b in zip(entries.values(), built, strict=True) if isinstance(b, ops.Failure)]


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


Timer = Callable[[int], float]  # microseconds per call over `reps` back-to-back calls


def timer(run: Callable[[], object]) -> Timer:
    def timed(reps: int) -> float:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            run()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) * 1000 / reps
    return timed


def paired_us(first: Timer, second: Timer) -> tuple[list[float], list[float]]:
    """ROUNDS timings of each, alternating (first, second, first, ...), so that a drift of the GPU's clocks or of
    the host between rounds shows in both; each timing is ~TARGET_MS of back-to-back calls after a warm-up."""
    first(2), second(2)
    reps = max(3, min(500, int(TARGET_MS * 1000 / max(first(1), 1.0))))
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(ROUNDS):
        times[0].append(first(reps))
        times[1].append(second(reps))
    return times


Forward = Callable[[], torch.Tensor]


def graphed(stock: Forward, patched: Forward) -> tuple[Paired, float | None]:
    """Each forward captured in a CUDA graph (after one warm-up call, which is where torch.compile compiles), the two
    replayed in alternating rounds; and the captured outputs' relative difference."""
    try:
        stock_graph, stock_out = capture(stock, calls=1, warmups=1)
        op_graph, op_out = capture(patched, calls=1, warmups=1)
        times = paired_us(timer(stock_graph.replay), timer(op_graph.replay))
    except RuntimeError as e:  # a forward that syncs or allocates on the host cannot be captured; compile errors
        torch.cuda.synchronize()
        return Paired.failed(e), None
    return Paired.of(*times), rel_diff(op_out[0], stock_out[0])


def called(stock: Forward, patched: Forward) -> tuple[Paired, float | None]:
    """Each forward timed as called, in alternating rounds, after WARM_CALLS calls each (torch.compile's
    reduce-overhead mode compiles, records its CUDA graph and replays it over those); the outputs' relative
    difference (cloned: a replay overwrites the graph's output)."""
    try:
        for _ in range(WARM_CALLS):
            stock_out, op_out = stock().clone(), patched().clone()
        times = paired_us(timer(stock), timer(patched))
    except RuntimeError as e:
        torch.cuda.synchronize()
        return Paired.failed(e), None
    return Paired.of(*times), rel_diff(op_out, stock_out)


@dataclass(frozen=True)
class Compiled:
    """A model and its patched copy through torch.compile in `mode`."""

    stock: torch.nn.Module
    patched: torch.nn.Module
    mode: str  # "default" or "reduce-overhead"


def measure(name: str, nets: tuple[torch.nn.Module, torch.nn.Module], tokens: int, layers: int,
            compiled: Compiled | None) -> Row:
    """nets: model `name`'s stock base model and its patched copy (compiled: both through torch.compile), at M =
    tokens."""
    stock, patched = nets
    x = torch.randn(1, tokens, stock.config.hidden_size, device="cuda", dtype=torch.float16)
    counts, saving = routes(stock.layers[0], tokens)

    def forward(net: torch.nn.Module) -> Forward:
        return lambda: net(inputs_embeds=x).last_hidden_state

    with torch.inference_mode():
        eager = Paired.of(*paired_us(timer(forward(stock)), timer(forward(patched))))
        graph, diff = graphed(forward(stock), forward(patched))
        comp, comp_diff, mode = None, None, ""
        if compiled:
            way = graphed if compiled.mode == "default" else called
            comp, comp_diff = way(forward(compiled.stock), forward(compiled.patched))
            mode = compiled.mode
    return Row(name, tokens, layers, counts[ops.Route.EXACT], counts[ops.Route.PADDED],
               counts[ops.Route.TORCH], saving * layers, eager, graph, diff, comp, comp_diff, mode)


def fmt(v: float | None, digits: int | None = 1) -> str:
    """v with thousands separators and `digits` decimals (None: scientific, 1 decimal), or n/a."""
    return "n/a" if v is None else f"{v:.1e}" if digits is None else f"{v:,.{digits}f}"


def speedup(p: Paired | None) -> str:
    return "n/a" if p is None or p.speedup is None else f"{p.speedup:.3f}x"


def times(p: Paired | None) -> str:
    return "n/a" if p is None else f"{fmt(p.torch_us)} / {fmt(p.op_us)}"


def table(rows: list[Row]) -> str:
    compiled = next((r.compile_mode for r in rows if r.compiled is not None), "")
    head = ("| model | M | routes exact/padded/torch | eager us: torch / cudal2 | eager | graph us: torch / cudal2 "
            "| graph | torch's graph spread | GEMM us saved per forward: predicted / graph | rel. diff |")
    head += f" compiled ({compiled}) us: torch / cudal2 | compiled | rel. diff |" if compiled else ""
    lines = [head, "|---" * head.count(" |") + "|"]
    for r in rows:
        g = r.graph
        measured = None if g.op_us is None else g.torch_us - g.op_us
        spread = "n/a" if g.spread is None else f"{100 * g.spread:.1f}%"
        line = (f"| {r.model} | {r.tokens} | {r.exact}/{r.padded}/{r.torch} | {times(r.eager)} | {speedup(r.eager)} | "
                f"{times(g)} | {speedup(g)} | {spread} | {fmt(r.predicted_saving_us)} / {fmt(measured)} | "
                f"{fmt(r.rel_diff, None)} |")
        if compiled:
            line += f" {times(r.compiled)} | {speedup(r.compiled)} | {fmt(r.compiled_rel_diff, None)} |"
        lines.append(line)
    errors = sorted({f"{way} {r.model} M={r.tokens}: {p.error}" for r in rows
                     for way, p in (("graph", r.graph), ("compiled", r.compiled)) if p and p.error})
    return "\n".join(lines + [f"- failed: {e}" for e in errors])


def parse_ints(text: str) -> tuple[int, ...]:
    try:
        return parse_token_counts(text)
    except ValueError as e:
        raise SystemExit(f"model_bench: {e}") from None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--library", default=None, help="an exported library directory")
    src.add_argument("--db", default=None, help="export from this result store first")
    ap.add_argument("--min-speedup", type=float, default=1.02, help="with --db: the export threshold")
    ap.add_argument("--host-cache-twins", action="store_true",
                    help="with --db: export sm90 kernels' verified host_cache twins in their place")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers per model")
    ap.add_argument("--eager-min-saving-us", type=float, default=ops.EAGER_MIN_SAVING_US,
                    help="patch_linear's threshold for eager calls (0: every kernel explain() picks)")
    ap.add_argument("--models", default=None, help="comma-separated names from cudal2.data.LLM_MODELS (all)")
    ap.add_argument("--tokens", default=",".join(map(str, TOKEN_COUNTS)), help="token counts M")
    ap.add_argument("--compile", nargs="?", const="default", default=None, choices=["default", "reduce-overhead"],
                    help="also both models through torch.compile in this mode (default: each forward then captured in "
                         "a CUDA graph; reduce-overhead: timed as called)")
    ap.add_argument("--out", default=None, help="write every row as JSON here")
    args = ap.parse_args()
    models, tokens = distinct_models(args.models.split(",") if args.models else None), parse_ints(args.tokens)
    if args.layers < 1:
        raise SystemExit(f"model_bench: --layers must be >= 1, got {args.layers}")
    if not torch.cuda.is_available():
        print("model_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.monotonic()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="cudal2-model-bench-") as tmp:
        try:
            library = (Path(args.library) if args.library else
                       export_from(Path(args.db), args.min_speedup, Path(tmp), args.host_cache_twins))
            manifest = Manifest.load(library)
            ops.load_library(library)  # kernels are built below, and on their shape's first call
        except (ExportError, ManifestError, ops.LibraryError, StoreError) as e:
            raise SystemExit(f"model_bench: {e}") from None
        twins = sum(e.timed_as is not None for e in manifest.kernels)
        print(f"library: {len(manifest.kernels)} kernel(s) ({twins} host_cache twins) on {manifest.gpu}; "
              f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
        shapes = {(m, n, k) for model in models for _, n, k in model.linears() for m in tokens}
        for failure in prebuild(library, shapes, os.cpu_count() or 1):
            print(f"  build failed (torch.matmul takes the shape): {failure}", flush=True)
        print(f"  kernels built: {time.monotonic() - start:.0f} s", flush=True)
        for model in models:
            net = build(model, args.layers, max(tokens))
            patched = copy.deepcopy(net)  # the patch is a bound method per module: the copy computes with its own
            ops.patch_linear(patched, eager_min_saving_us=args.eager_min_saving_us)
            compiled = (Compiled(torch.compile(net, mode=args.compile), torch.compile(patched, mode=args.compile),
                                 args.compile) if args.compile else None)
            for m in tokens:
                rows.append(measure(model.name, (net, patched), m, args.layers, compiled))
                print(f"  {model.name} M={m}: {time.monotonic() - start:.0f} s", flush=True)
            del net, patched, compiled
            torch.cuda.empty_cache()
            if args.compile:  # dynamo's recompile limit counts per code object, across models: start each afresh
                torch._dynamo.reset()
    print(f"\n{table(rows)}\n")
    print(f"geomean over {len(rows)} (model, M): "
          + ", ".join(f"{way} {geomean(done):.3f}x over {len(done)}" for way, done in
                      (("eager", [r.eager.speedup for r in rows]),
                       ("graph", [r.graph.speedup for r in rows if r.graph.speedup]),
                       (f"compiled ({args.compile})",
                        [r.compiled.speedup for r in rows if r.compiled and r.compiled.speedup]))
                      if done)
          + f"; total {time.monotonic() - start:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
