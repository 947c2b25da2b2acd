"""cudal2.ops: the dispatch rule on fixture libraries, library loading, the torch op on CPU (fallback, tracing,
autograd, errors), one real build with nvcc; on a GPU, kernels exported from real evaluations against torch."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import warnings
from copy import deepcopy
from pathlib import Path

import pytest
import torch

from cudal2 import ops
from cudal2.export import (
    MANIFEST_NAME,
    TORCH_BASELINE,
    ExportRequest,
    Manifest,
    ManifestError,
    plan_export,
    sha256_text,
    write_library,
)
from cudal2.kernels.sm80 import Reduce, Sm80Family
from cudal2.kernels.small import SmallConfig, SmallFamily
from cudal2.sandbox.types import Acc, Task
from tests.library_fixtures import GPU, entry, manifest, write_fixture_library

ROOT = Path(__file__).resolve().parent.parent
OTHER_GPU = "NVIDIA A100-SXM4-80GB (sm_80)"


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch, tmp_path):
    """No library active, none found by default (the default location is under this test's tmp_path)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(ops.ENV_LIBRARY, raising=False)
    ops.unload_library()
    yield
    ops.unload_library()


# -- the dispatch rule -----------------------------------------------------------------------------------------

LIB = manifest(
    entry(128, 4096, 4096, median_us=100.0, torch_us=200.0),  # 2x faster than torch
    entry(2048, 2048, 2048, median_us=100.0, torch_us=104.0),  # 1.04x: too little to pay for padding
    entry(4096, 4096, 4096, median_us=1000.0, torch_us=1300.0),
    entry(256, 256, 256, median_us=9.0, torch_us=10.0),
    entry(64, 64, 64, median_us=10.0, torch_us=8.0),  # slower than torch.matmul
)


def decide(m, n, k, label=GPU, **kw) -> ops.Decision:
    return ops.decide(LIB, m, n, k, label, **kw)


def test_exact_shape_takes_its_kernel() -> None:
    d = decide(128, 4096, 4096)
    assert d.route is ops.Route.EXACT and d.kernel.file == "128_4096_4096.cu" and d.est_speedup == 2.0
    assert str(d).startswith("128_4096_4096 -> cudal2 kernel: kernel 128_4096_4096.cu: 100.0 us vs torch.matmul")
    assert "2.00x" in d.reason and GPU in d.reason


def test_exact_kernel_slower_than_torch_is_not_used_unless_allowed() -> None:
    d = decide(64, 64, 64)
    assert d.route is ops.Route.TORCH and "0.80x, below min_speedup 1" in d.reason
    assert decide(64, 64, 64, min_speedup=0.0).route is ops.Route.EXACT


def test_padding_when_measurements_justify_it() -> None:
    d = decide(120, 4096, 4096)  # 6.7% more FLOPs; kernel 100 us + ~6 us padding vs torch >= 187.5 us
    assert d.route is ops.Route.PADDED and d.kernel.task.mnk == "128_4096_4096"
    assert d.est_speedup == pytest.approx(187.5 / (100 + ops.padding_us(120, 4096, 4096, d.kernel)))
    assert "padded to 128_4096_4096" in str(d) and ">= 187.5 us" in d.reason
    assert decide(4000, 4096, 4096).route is ops.Route.PADDED  # large shapes: padding copies are cheap


@pytest.mark.parametrize("shape, why", [
    ((64, 4096, 4096), "does 100% more FLOPs"),  # half the work would be padding
    ((2040, 2048, 2048), "padding to 2048_2048_2048 not justified"),  # 1.04x does not cover the copies
    ((100, 100, 100), "256_256_256 does 1578% more FLOPs"),  # the nearest larger shape by FLOPs is the one weighed
    ((8192, 8192, 8192), "no exported kernel for 8192_8192_8192 or any larger shape"),
    ((60, 64, 64), "nearest larger exported shape 64_64_64 is itself below min_speedup"),
    ((0, 64, 64), "dimensions outside"),
])
def test_fallback_reasons(shape, why) -> None:
    d = decide(*shape)
    assert d.route is ops.Route.TORCH and d.kernel is None and why in d.reason
    assert str(d).startswith(f"{'_'.join(map(str, shape))} -> torch.matmul: ")


def test_library_of_another_gpu_is_refused() -> None:
    d = decide(128, 4096, 4096, label=OTHER_GPU)
    assert d.route is ops.Route.TORCH and f"measured on {GPU}, this device is {OTHER_GPU}" in d.reason


def test_broken_kernels_are_skipped() -> None:
    broken = {(128, 4096, 4096): "returned 1 on 128_4096_4096"}
    d = decide(128, 4096, 4096, broken=broken)
    assert d.route is ops.Route.TORCH and "unusable: returned 1" in d.reason
    d = decide(120, 4096, 4096, broken=broken)  # the next larger shape (4096^3) is far too big
    assert d.route is ops.Route.TORCH and "4096_4096_4096" in d.reason


def test_padding_cost_model() -> None:
    e = LIB.kernel(4096, 4096, 4096)
    assert ops.padding_us(4096, 4096, 4096, e) == 0
    a_copy = 2 * (4000 * 4096 + 4096 * 4096)  # read A [4000, 4096], write A' [4096, 4096], bytes
    assert ops.padding_us(4000, 4096, 4096, e) == pytest.approx(ops.PAD_LAUNCH_US + a_copy / ops.PAD_BYTES_PER_US)
    # N padded: B is copied and C[:, :N] sliced into a contiguous copy
    assert ops.padding_us(4096, 4000, 4096, e) == pytest.approx(
        2 * ops.PAD_LAUNCH_US + (2 * (4000 * 4096 + 4096 * 4096) + 4 * 4096 * 4000) / ops.PAD_BYTES_PER_US)


# -- loading libraries -----------------------------------------------------------------------------------------


def test_load_library_paths(tmp_path: Path, monkeypatch) -> None:
    explicit = write_fixture_library(tmp_path / "explicit", LIB)
    assert ops.load_library(explicit).manifest == LIB
    assert ops.active_library().directory == explicit
    from_env = write_fixture_library(tmp_path / "env", manifest(entry(256, 256, 256, 9.0, 10.0)))
    monkeypatch.setenv(ops.ENV_LIBRARY, str(from_env))
    assert ops.load_library().directory == from_env
    monkeypatch.delenv(ops.ENV_LIBRARY)
    default = write_fixture_library(tmp_path / "cache" / "cudal2" / "ops", LIB)
    assert ops.library_dir() == default == ops.default_library_dir()
    ops.unload_library()
    assert ops.active_library().directory == default  # loaded lazily on first use


def test_missing_or_malformed_library(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such manifest") as info:
        ops.load_library(tmp_path / "nowhere")
    assert "\n" not in str(info.value)
    problem = ops.active_library()  # the lazy default load does not raise: it says why
    assert isinstance(problem, str) and problem.startswith("no kernel library: ") and "no such manifest" in problem
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / MANIFEST_NAME).write_text('{"format_version": 1}')
    with pytest.raises(ManifestError, match="missing field"):
        ops.load_library(tmp_path / "bad")
    with pytest.raises(ops.LibraryError, match="must be a finite number >= 0"):
        ops.load_library(tmp_path / "bad", min_speedup=float("nan"))


def test_fp16_accumulating_library_needs_consent(tmp_path: Path) -> None:
    e = dataclasses.replace(entry(256, 256, 256, 9.0, 10.0), acc=Acc.FP16)
    directory = write_fixture_library(tmp_path / "fp16", manifest(e, acc=Acc.FP16))
    with pytest.raises(ops.LibraryError, match="allow_fp16_acc=True"):
        ops.load_library(directory)
    assert ops.load_library(directory, allow_fp16_acc=True).manifest.acc is Acc.FP16


def test_failed_kernel_is_recorded_and_explained(tmp_path: Path) -> None:
    library = ops.load_library(write_fixture_library(tmp_path / "lib", LIB))
    decision = library.decide(128, 4096, 4096, GPU)
    with pytest.warns(RuntimeWarning, match="returned 3 on 128_4096_4096; using torch.matmul"):
        ops._kernel_failed(decision, "returned 3 on 128_4096_4096")
    d = library.decide(128, 4096, 4096, GPU)
    assert d.route is ops.Route.TORCH and "kernel 128_4096_4096.cu returned 3" in d.reason


def test_explain_names_cpu_and_missing_cuda() -> None:
    assert "tensors on cpu: cudal2 kernels run on CUDA devices only" in str(ops.explain(64, 64, 64, device="cpu"))
    if not torch.cuda.is_available():
        assert "no CUDA device available" in ops.explain(64, 64, 64, device="cuda").reason
        assert ops.explain(64, 64, 64).route is ops.Route.TORCH


# -- the op on CPU tensors (torch.matmul path) ---------------------------------------------------------------


def half(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float16)


def test_cpu_tensors_fall_back_to_torch_matmul() -> None:
    a, b = half(5, 8), half(3, 8)
    assert torch.equal(ops.hgemm(a, b), torch.matmul(a, b.t()))
    at = half(8, 5).t()  # non-contiguous
    assert torch.equal(ops.hgemm(at, b), torch.matmul(at, b.t()))


def test_linear_reshapes_batch_dimensions() -> None:
    x, w, bias = half(2, 3, 8), half(4, 8), half(4)
    y = ops.linear(x, w, bias)
    assert y.shape == (2, 3, 4)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, bias), rtol=2e-3, atol=2e-3)
    assert ops.linear(half(8), w).shape == (4,)
    assert ops.linear(half(0, 8), w).shape == (0, 4)


def tiny_model() -> torch.nn.Module:
    """Two float16 linear layers (one with bias) and one float32 one, nested as a model's layers are."""
    torch.manual_seed(0)
    block = torch.nn.ModuleDict({"q_proj": torch.nn.Linear(8, 16, bias=True), "down": torch.nn.Linear(16, 8, bias=False)})
    return torch.nn.ModuleDict({"layer": block.half(), "head": torch.nn.Linear(8, 4)})


def run_tiny(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = model["layer"]["down"](model["layer"]["q_proj"](x))
    return h, model["head"](h.float())


@pytest.fixture
def linear_calls(monkeypatch) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The (x, w) shapes of every call that goes through cudal2.ops' op (ops._linear, behind linear and the patched
    forward; F.linear's route does not), which still computes."""
    calls, real_linear = [], ops._linear
    monkeypatch.setattr(ops, "_linear", lambda x, w, bias: calls.append((tuple(x.shape), tuple(w.shape)))
                        or real_linear(x, w, bias))
    return calls


def test_patch_linear_patches_float16_layers_and_removes(linear_calls) -> None:
    model, x = tiny_model(), half(3, 5, 8)
    stock = run_tiny(model, x)
    patch = ops.patch_linear(model)
    assert patch.patched == ("layer.q_proj", "layer.down")
    assert patch.skipped == (("head", "weight is torch.float32, not torch.float16"),)
    assert all("forward" in model["layer"][name].__dict__ for name in ("q_proj", "down"))
    patched = run_tiny(model, x)
    assert linear_calls == []  # on the CPU the patched layers call F.linear: cudal2 kernels run on CUDA devices only
    for a, b in zip(patched, stock, strict=True):
        assert torch.equal(a, b)
    assert "forward" not in model["head"].__dict__ and set(model.state_dict()) == set(tiny_model().state_dict())
    assert ops.patch_linear(model).patched == patch.patched  # patching twice patches each module once
    copy = deepcopy(model)  # a copy's patched layers compute with the copy's own weights
    torch.nn.init.zeros_(copy["layer"]["down"].weight)
    assert torch.equal(run_tiny(copy, x)[0], torch.zeros(3, 5, 8, dtype=torch.float16))
    assert torch.equal(run_tiny(model, x)[0], stock[0])
    patch.remove()
    assert all("forward" not in m.__dict__ and not hasattr(m, "cudal2_eager_min_saving_us") for m in model.modules())


def test_saving_per_call_by_the_manifest() -> None:
    assert ops.saving_us(decide(128, 4096, 4096)) == pytest.approx(100.0)  # 100 us against torch's 200
    assert ops.saving_us(decide(256, 256, 256)) == pytest.approx(1.0)  # too little for an eager call (10 us)
    assert ops.saving_us(decide(64, 64, 64, min_speedup=0.0)) == pytest.approx(-2.0)  # a slower kernel forced on
    assert ops.saving_us(decide(33, 77, 5)) == 0.0  # torch.matmul's route
    padded = decide(120, 4096, 4096)  # torch >= 187.5 us (scaled by FLOPs) against 100 us + the padding's copies
    assert ops.saving_us(padded) == pytest.approx(187.5 - 100 - ops.padding_us(120, 4096, 4096, padded.kernel))


def test_bias_add_cost_model() -> None:
    assert ops.bias_add_us(1, 128) == pytest.approx(ops.BIAS_ADD_LAUNCH_US, rel=1e-3)  # a launch, a few bytes
    big = 4 * 8192 * 3584 / ops.BIAS_ADD_BYTES_PER_US  # 117 MB read and written
    assert ops.bias_add_us(8192, 3584) == pytest.approx(ops.BIAS_ADD_LAUNCH_US + big)
    assert 60 < ops.bias_add_us(8192, 3584) < 120  # linear_bench on the H200 measured 91 us there


def test_a_bias_takes_the_kernel_only_where_it_saves_more_than_the_add() -> None:
    d = decide(128, 4096, 4096, bias=True)  # 100 us saved, the add ~3 us
    assert d.route is ops.Route.EXACT and "with the bias added after it" in d.reason
    assert d.saving_us == pytest.approx(100.0 - ops.bias_add_us(128, 4096)) and d.est_speedup == 2.0
    small = decide(256, 256, 256, bias=True)  # 1 us saved: less than the add costs
    assert small.route is ops.Route.TORCH and decide(256, 256, 256).route is ops.Route.EXACT
    assert "with a bias: the kernel saves 1.0 us, the separate bias add costs ~1.8 us (F.linear fuses it)" in small.reason
    padded = decide(120, 4096, 4096, bias=True)
    assert padded.route is ops.Route.PADDED
    assert padded.saving_us == pytest.approx(decide(120, 4096, 4096).saving_us - ops.bias_add_us(120, 4096))
    assert decide(33, 77, 5, bias=True) == decide(33, 77, 5)  # torch's route either way


def test_patch_linear_leaves_a_forward_replaced_by_something_else() -> None:
    model = tiny_model()
    mine = model["layer"]["down"].forward = lambda x: x
    patch = ops.patch_linear(model)
    assert patch.patched == ("layer.q_proj",)
    assert ("layer.down", "its forward was replaced already (by something else)") in patch.skipped
    patch.remove()
    assert model["layer"]["down"].forward is mine


def test_patch_linear_as_a_context_manager() -> None:
    model, x = tiny_model(), half(2, 8)
    with ops.patch_linear(model) as patch:
        assert "forward" in model["layer"]["q_proj"].__dict__ and patch.patched == ("layer.q_proj", "layer.down")
        run_tiny(model, x)
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("call, error, message", [
    (lambda: ops.hgemm(torch.randn(4, 8), torch.randn(3, 8)), TypeError, "a is torch.float32; cudal2 kernels are float16"),
    (lambda: ops.hgemm(half(4, 8), half(3, 8).bfloat16()), TypeError, "b_nk is torch.bfloat16"),
    (lambda: ops.hgemm(half(4, 8), [[1.0]]), TypeError, "b_nk must be a torch.Tensor"),
    (lambda: ops.hgemm(half(4, 8), half(3, 7)), ValueError, "expects a [M, K] and b_nk [N, K], got (4, 8) and (3, 7)"),
    (lambda: ops.hgemm(half(2, 4, 8), half(3, 8)), ValueError, "expects a [M, K]"),
    (lambda: ops.hgemm(half(4, 8), half(3, 8).to("meta")), ValueError, "different devices: cpu, meta"),
    (lambda: ops.linear(half(4, 8), half(3, 8), half(4)), ValueError, "bias must be [N] = [3], got (4,)"),
    (lambda: ops.linear(half(4, 8), half(8)), ValueError, "expects x [..., K] and w [N, K]"),
])
def test_bad_inputs_raise_clear_errors(call, error, message) -> None:
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)


def test_op_traces_under_torch_compile() -> None:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x, w = half(2, 5, 8), half(3, 8)
    compiled = torch.compile(lambda x, w: ops.linear(x, w), backend=backend, fullgraph=True)
    assert torch.equal(compiled(x, w), ops.linear(x, w))
    hgemm_op = (torch.ops.cudal2.hgemm, torch.ops.cudal2.hgemm.default)
    assert any(node.target in hgemm_op for g in graphs for node in g.graph.nodes)
    # through AOT autograd: the fake implementation gives shapes, also symbolic ones
    aot = torch.compile(lambda x, w: ops.linear(x, w), backend="aot_eager", fullgraph=True, dynamic=True)
    for m in (5, 7):
        x = half(2, m, 8)
        assert torch.equal(aot(x, w), ops.linear(x, w))


def test_op_registration_and_autograd() -> None:
    a, b = half(5, 8), half(3, 8)
    torch.library.opcheck(torch.ops.cudal2.hgemm.default, (a, b))
    a, b = a.float().requires_grad_(), b.float().requires_grad_()
    ah, bh = a.detach().half().requires_grad_(), b.detach().half().requires_grad_()
    ops.hgemm(ah, bh).float().sum().backward()
    torch.matmul(a, b.t()).sum().backward()
    torch.testing.assert_close(ah.grad.float(), a.grad, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(bh.grad.float(), b.grad, rtol=1e-2, atol=1e-2)


# -- building a kernel (nvcc, no GPU needed) ---------------------------------------------------------------------


@pytest.mark.nvcc
def test_compile_and_bind_a_real_kernel(tmp_path: Path) -> None:
    path = ROOT / "kernels" / "seed" / "mma_multistage.cu"
    digest = sha256_text(path.read_text())
    lib = ops.compile_kernel(path, digest, "sm_90a", tmp_path / "build")
    assert isinstance(lib, str) and Path(lib).is_file()
    assert ops.compile_kernel(path, digest, "sm_90a", tmp_path / "build") == lib  # the content-addressed cache
    assert ops.load_cudart() == ""
    kernel = ops.bind(lib)
    assert isinstance(kernel, ops.LoadedKernel) and kernel.workspace_bytes(128, 128, 128) == 0
    changed = ops.compile_kernel(path, "0" * 64, "sm_90a", tmp_path / "build")
    assert isinstance(changed, ops.Failure) and "changed since the export" in changed.reason
    broken = tmp_path / "broken.cu"
    broken.write_text("this is not CUDA\n")
    failure = ops.compile_kernel(broken, sha256_text(broken.read_text()), "sm_90a", tmp_path / "build")
    assert isinstance(failure, ops.Failure) and "compile_error" in failure.reason


# The small family's grid_k measured fastest on 64x64x4096 on the H200 (benchmarks/RESULTS.md, thirty-eighth session).
TICKET_CONFIG = SmallConfig(16, 16, 1, 2, 8, 2, Acc.FP32, grid_k=8)


def test_the_ticket_mark_finds_exactly_the_kernels_with_tickets() -> None:
    small, sm80 = SmallFamily(), Sm80Family()
    with_tickets = [small.render(TICKET_CONFIG), sm80.render(dataclasses.replace(sm80.default(), split_k=8,
                                                                                  reduce=Reduce.LAST))]
    without = [small.render(small.default()), small.render(dataclasses.replace(TICKET_CONFIG, grid_k=1, cluster_k=8)),
               sm80.render(dataclasses.replace(sm80.default(), split_k=8, reduce=Reduce.CLUSTER)),
               (ROOT / "kernels" / "seed" / "mma_multistage.cu").read_text()]
    assert all(ops.TICKETS_MARK in s for s in with_tickets)
    assert not any(ops.TICKETS_MARK in s for s in without)


class _Recorder:
    """torch.cuda's stream calls that `_in_stream_order` makes, recorded (no GPU here): what waited for what."""

    def __init__(self, monkeypatch, capturing: bool = False) -> None:
        self.current, self.waits = 0, []
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
        monkeypatch.setattr(torch.cuda, "ExternalStream", lambda handle, device: ("stream", handle, device))
        recorder = self

        class Current:
            def wait_stream(self, other) -> None:
                recorder.waits.append((recorder.current, other))

        monkeypatch.setattr(torch.cuda, "current_stream", lambda index: Current())

    def call(self, order: ops.StreamOrder, stream: int, device: int = 0) -> int:
        self.current = stream
        return ops._in_stream_order(order, device, stream, lambda: stream * 10)


def test_ticket_kernel_launches_wait_for_the_stream_that_ran_one_last(monkeypatch) -> None:
    rec, order = _Recorder(monkeypatch), ops.StreamOrder()
    assert [rec.call(order, s) for s in (7, 7, 8, 8, 7)] == [70, 70, 80, 80, 70]  # the launch's return value
    assert rec.waits == [(8, ("stream", 7, 0)), (7, ("stream", 8, 0))]  # only where the stream changed
    rec.call(order, 9, device=1)  # another device: its own order
    assert len(rec.waits) == 2 and order.last == {0: 7, 1: 9}


def test_ticket_kernel_launches_under_graph_capture_are_not_ordered(monkeypatch) -> None:
    rec, order = _Recorder(monkeypatch, capturing=True), ops.StreamOrder()
    order.last[0] = 7
    assert rec.call(order, 8) == 80
    assert rec.waits == [] and order.last == {0: 7}


# -- GPU: real kernels, exported from real evaluations --------------------------------------------------------

# The seed kernel is slower than cuBLAS, so it is exported with --min-speedup 0 and loaded with min_speedup=0:
# these tests check the mechanics and the numbers, the benchmark measures speed.
SEED_SHAPES = [Task(256, 512, 1024), Task(1024, 1024, 1024), Task(128, 4096, 512), Task(512, 512, 4096)]
# One build cache for every GPU test (the autouse fixture moves XDG_CACHE_HOME per test).
BUILDS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cudal2" / "build"


@pytest.fixture(scope="module")
def seed_library(tmp_path_factory) -> Path:
    from cudal2.sandbox.evaluator import EvalOptions, Evaluator
    from cudal2.sandbox.store import ResultStore

    tmp = tmp_path_factory.mktemp("seedlib")
    with ResultStore(tmp / "results.sqlite") as store:
        ev = Evaluator(EvalOptions(target_ms=5, warmup_ms=2, min_reps=3, max_reps=20), store)
        res = ev.evaluate((ROOT / "kernels" / "seed" / "mma_multistage.cu").read_text(), SEED_SHAPES)
        assert all(s.status.value == "ok" for s in res.shapes), [s.reason for s in res.shapes]
        plan = plan_export(store, ExportRequest(ev.gpu_label, min_speedup=0.0))
    assert len(plan.manifest.kernels) == len(SEED_SHAPES), plan.skipped
    write_library(tmp / "lib", plan)
    return tmp / "lib"


def retimed(seed_library: Path, out: Path, torch_us) -> Path:
    """A copy of the seed library whose every baseline time is torch_us(entry): the dispatch rule's inputs, set."""
    m = Manifest.load(seed_library)
    for e in m.kernels:
        shutil.copy(seed_library / e.file, out / e.file)
    kernels = tuple(dataclasses.replace(e, baseline_us=dict.fromkeys(e.baseline_us, torch_us(e))) for e in m.kernels)
    dataclasses.replace(m, kernels=kernels).save(out)
    return out


@pytest.fixture(scope="module")
def padding_library(seed_library: Path, tmp_path_factory) -> Path:
    """The seed library with torch's times inflated 100x, so that the padding rule pads: exercises that path."""
    return retimed(seed_library, tmp_path_factory.mktemp("padlib"), lambda e: e.baseline_us[TORCH_BASELINE] * 100)


def rel_err(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error against the exact product rounded to half (the evaluator's measure)."""
    ref = (a.double() @ b.double().t()).half().float()  # fp64 on the GPU: no TF32 whatever torch's settings
    return ((c.float() - ref).norm() / ref.norm()).item()


def tol(k: int) -> float:
    """The evaluator's fp32 tolerance, 2.5e-4 * sqrt(K / 1024), held at its K = 1024 value for smaller K."""
    return 2.5e-4 * math.sqrt(max(k, 1024) / 1024)


def cuda_half(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float16, device="cuda")


def check(m: int, n: int, k: int, route: ops.Route) -> None:
    d = ops.explain(m, n, k)
    assert d.route is route, str(d)
    a, b = cuda_half(m, k), cuda_half(n, k)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cudal2.ops")  # a kernel refusing the call would warn
        c = ops.hgemm(a, b)
    torch.cuda.synchronize()
    assert c.shape == (m, n) and c.dtype == torch.float16
    assert rel_err(c, a, b) <= tol(k), (str(d), rel_err(c, a, b))
    assert ops.explain(m, n, k).route is route


@pytest.mark.gpu
@pytest.mark.parametrize("task", SEED_SHAPES, ids=lambda t: t.mnk)
def test_exact_kernels_match_the_fp32_reference(seed_library: Path, task: Task) -> None:
    library = ops.load_library(seed_library, cache_dir=BUILDS, min_speedup=0.0, build=True)
    check(task.m, task.n, task.k, ops.Route.EXACT)
    assert library.broken == {}


@pytest.mark.gpu
@pytest.mark.parametrize("shape, route", [
    ((1000, 1024, 1024), ops.Route.PADDED), ((1024, 1000, 1024), ops.Route.PADDED),
    ((1024, 1024, 1000), ops.Route.PADDED), ((1021, 1019, 1017), ops.Route.PADDED),
    ((250, 500, 1020), ops.Route.PADDED), ((127, 4093, 509), ops.Route.PADDED),
    ((2048, 2048, 2048), ops.Route.TORCH), ((33, 77, 5), ops.Route.TORCH),
])
def test_odd_shapes_pad_or_fall_back(padding_library: Path, shape, route) -> None:
    ops.load_library(padding_library, cache_dir=BUILDS, min_speedup=0.0)
    check(*shape, route)


@pytest.mark.gpu
def test_noncontiguous_and_misaligned_operands(seed_library: Path) -> None:
    ops.load_library(seed_library, cache_dir=BUILDS, min_speedup=0.0)
    a = cuda_half(1024, 1024).t()  # non-contiguous
    b = cuda_half(1024 * 1024 + 8)[8:].view(1024, 1024)  # contiguous, 16 bytes past an allocation's start
    assert not a.is_contiguous() and b.data_ptr() % ops.ALIGN_BYTES != 0
    c = ops.hgemm(a, b)
    assert rel_err(c, a, b) <= tol(1024)


@pytest.mark.gpu
def test_linear_with_batch_dimensions_and_bias(seed_library: Path) -> None:
    ops.load_library(seed_library, cache_dir=BUILDS, min_speedup=0.0)
    x, w, bias = cuda_half(4, 256, 1024), cuda_half(1024, 1024), cuda_half(1024)  # M = 4 * 256 = 1024
    assert ops.explain(1024, 1024, 1024).route is ops.Route.EXACT
    y = ops.linear(x, w, bias)
    assert y.shape == (4, 256, 1024)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, bias), rtol=1e-2, atol=5e-2)


@pytest.mark.gpu
def test_under_torch_compile(seed_library: Path) -> None:
    ops.load_library(seed_library, cache_dir=BUILDS, min_speedup=0.0, build=True)
    x, w = cuda_half(2, 512, 1024), cuda_half(1024, 1024)
    compiled = torch.compile(lambda x, w: torch.relu(ops.linear(x, w)), fullgraph=True)
    y = compiled(x, w)
    torch.testing.assert_close(y, torch.relu(torch.nn.functional.linear(x, w)), rtol=1e-2, atol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, route", [((1024, 1024, 1024), ops.Route.EXACT), ((1000, 1000, 1000), ops.Route.PADDED)])
def test_inside_cuda_graph_capture_and_replay(padding_library: Path, shape, route) -> None:
    ops.load_library(padding_library, cache_dir=BUILDS, min_speedup=0.0, build=True)
    m, n, k = shape
    assert ops.explain(m, n, k).route is route
    a, b = cuda_half(m, k), cuda_half(n, k)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch requires
        ops.hgemm(a, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = ops.hgemm(a, b)
    for _ in range(2):  # new inputs each replay: the captured kernel really reads them
        a.copy_(cuda_half(m, k))
        b.copy_(cuda_half(n, k))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(c, a, b) <= tol(k)


@pytest.mark.gpu
def test_patch_linear_takes_kernels_eagerly_only_where_they_save_enough(seed_library: Path, linear_calls) -> None:
    """Eager calls take the kernel only at eager_min_saving_us or more saved per call; CUDA-graph capture always."""
    ops.load_library(seed_library, cache_dir=BUILDS, min_speedup=0.0, build=True)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(1024, 1024, bias=False), torch.nn.ReLU(), torch.nn.Linear(1024, 1024, bias=False)]
    model = torch.nn.Sequential(*layers).half().cuda()
    x = cuda_half(1024, 1024)
    with torch.no_grad():
        stock = model(x)
        with ops.patch_linear(model, eager_min_saving_us=-math.inf):  # every kernel explain() picks, eagerly too
            torch.testing.assert_close(model(x), stock, rtol=1e-2, atol=5e-2)
        assert len(linear_calls) == 2
        linear_calls.clear()
        with ops.patch_linear(model, eager_min_saving_us=math.inf):  # no kernel saves that much
            torch.testing.assert_close(model(x), stock, rtol=0, atol=0)
            assert linear_calls == []
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # captured: the kernels, whatever they save
                out = model(x)
        assert len(linear_calls) == 2
        graph.replay()
        torch.testing.assert_close(out, stock, rtol=1e-2, atol=5e-2)


@pytest.mark.gpu
def test_a_bias_goes_to_f_linear_unless_the_kernel_saves_more_than_the_add(seed_library: Path, tmp_path: Path,
                                                                          linear_calls) -> None:
    """Each kernel 1 us faster than torch: F.linear (bias fused) for a biased layer, eager or captured; the kernel for
    the same shape without a bias. 100x: the kernel, then the bias added."""
    x, w, bias = cuda_half(4, 256, 1024), cuda_half(1024, 1024), cuda_half(1024)  # M = 4 * 256 = 1024
    stock = torch.nn.functional.linear(x, w, bias)
    (tmp_path / "thin").mkdir()
    ops.load_library(retimed(seed_library, tmp_path / "thin", lambda e: e.median_us + 1.0), cache_dir=BUILDS)
    assert ops.explain(1024, 1024, 1024).route is ops.Route.EXACT
    assert ops.explain(1024, 1024, 1024, bias=True).route is ops.Route.TORCH
    with torch.no_grad():
        assert torch.equal(ops.linear(x, w, bias), stock) and linear_calls == []
        layer = torch.nn.Linear(1024, 1024).half().cuda()
        with ops.patch_linear(layer, eager_min_saving_us=-math.inf):
            layer(x)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                layer(x)
            assert linear_calls == []
            layer.bias = None
            layer(x)
            assert len(linear_calls) == 1  # no bias: the kernel
        linear_calls.clear()
        (tmp_path / "wide").mkdir()
        ops.load_library(retimed(seed_library, tmp_path / "wide", lambda e: e.median_us * 100), cache_dir=BUILDS)
        assert ops.explain(1024, 1024, 1024, bias=True).route is ops.Route.EXACT
        torch.testing.assert_close(ops.linear(x, w, bias), stock, rtol=1e-2, atol=5e-2)
        assert linear_calls == [((4, 256, 1024), (1024, 1024))]


REFUSING_KERNEL = """#include <cuda_fp16.h>
#include <cuda_runtime.h>
extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    return 3;  // refuses every call
}
"""


@pytest.mark.gpu
def test_kernel_returning_nonzero_falls_back_and_says_why(tmp_path: Path) -> None:
    label = ops._device_info(torch.cuda.current_device()).label
    e = dataclasses.replace(entry(64, 64, 64, 1.0, 10.0, gpu=label), source_hash=sha256_text(REFUSING_KERNEL))
    (tmp_path / e.file).write_text(REFUSING_KERNEL)
    manifest(e, gpu=label).save(tmp_path)
    ops.load_library(tmp_path, cache_dir=BUILDS)
    assert ops.explain(64, 64, 64).route is ops.Route.EXACT
    a, b = cuda_half(64, 64), cuda_half(64, 64)
    with pytest.warns(RuntimeWarning, match="returned 3 on 64_64_64"):
        c = ops.hgemm(a, b)
    assert torch.equal(c, torch.matmul(a, b.t()))
    d = ops.explain(64, 64, 64)
    assert d.route is ops.Route.TORCH and "returned 3" in d.reason
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cudal2.ops")  # never retried, so no second warning
        ops.hgemm(a, b)


@pytest.mark.gpu
def test_a_ticket_kernel_called_on_two_streams_at_once_stays_correct(tmp_path: Path) -> None:
    """Two streams call the same grid_k kernel back to back, 40 times each, with nothing between them: the calls are
    put in one order (a ticket left to another stream's launch would leave a tile unstored or summed twice)."""
    label = ops._device_info(torch.cuda.current_device()).label
    source = SmallFamily().render(TICKET_CONFIG)
    e = dataclasses.replace(entry(64, 64, 4096, 1.0, 10.0, gpu=label), source_hash=sha256_text(source))
    (tmp_path / e.file).write_text(source)
    manifest(e, gpu=label).save(tmp_path)
    library = ops.load_library(tmp_path, cache_dir=BUILDS, build=True)
    assert ops.explain(64, 64, 4096).route is ops.Route.EXACT
    inputs = [(cuda_half(64, 4096), cuda_half(64, 4096)) for _ in range(2)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs: list[list[torch.Tensor]] = [[], []]
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cudal2.ops")
        for _ in range(40):
            for i, stream in enumerate(streams):
                with torch.cuda.stream(stream):
                    outs[i].append(ops.hgemm(*inputs[i]))
    torch.cuda.synchronize()
    for (a, b), results in zip(inputs, outs, strict=True):
        assert rel_err(results[0], a, b) <= tol(4096)
        assert all(torch.equal(c, results[0]) for c in results)  # the kernel is deterministic
    kernel = library.kernel(library.manifest.kernels[0], ops._device_info(torch.cuda.current_device()).arch)
    assert kernel.order is not None and kernel.order.last


@pytest.mark.gpu
def test_library_from_another_gpu_is_refused(seed_library: Path, tmp_path: Path) -> None:
    m = Manifest.load(seed_library)
    other = dataclasses.replace(m, gpu=OTHER_GPU, kernels=tuple(dataclasses.replace(e, gpu=OTHER_GPU)
                                                                 for e in m.kernels))
    for e in m.kernels:
        shutil.copy(seed_library / e.file, tmp_path / e.file)
    other.save(tmp_path)
    ops.load_library(tmp_path, cache_dir=BUILDS, min_speedup=0.0)
    d = ops.explain(1024, 1024, 1024)
    assert d.route is ops.Route.TORCH and f"measured on {OTHER_GPU}" in d.reason
    a, b = cuda_half(1024, 1024), cuda_half(1024, 1024)
    assert torch.equal(ops.hgemm(a, b), torch.matmul(a, b.t()))
