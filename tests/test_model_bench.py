"""benchmarks/model_bench.py on the CPU: the models it builds from cudal2.data's dims (scaled down), patched by
cudal2.ops.patch_linear, compute what the stock model computes; its choice of models and its table."""

import dataclasses
import importlib
import sys
from pathlib import Path

import pytest
import torch

from cudal2 import ops
from cudal2.data import LLM_MODELS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
model_bench = importlib.import_module("model_bench")


def scaled(name: str, factor: int):
    """An LLM_MODELS entry with every width divided by `factor` (heads and head_dim kept in proportion)."""
    m = next(m for m in LLM_MODELS if m.name == name)
    return dataclasses.replace(m, hidden=m.hidden // factor, intermediate=m.intermediate // factor,
                               head_dim=m.head_dim // factor)


@pytest.mark.parametrize("name", ["Qwen2.5-0.5B", "Mistral-Nemo-12B"])
def test_patched_model_computes_what_the_stock_model_does(name: str) -> None:
    model = scaled(name, 16 if name.startswith("Mistral") else 8)
    net = model_bench.build(model, layers=2, max_tokens=16, device="cpu")
    shapes = {(m.out_features, m.in_features) for m in net.modules() if isinstance(m, torch.nn.Linear)}
    assert shapes == {(n, k) for _, n, k in model.linears()}  # the layers the leaderboard's rows name
    biased = {name.rsplit(".", 1)[-1] for name, m in net.layers[0].named_modules()
              if isinstance(m, torch.nn.Linear) and m.bias is not None}
    assert biased == {layer for layer, _, _ in model.linears() if model.has_bias(layer)}  # Qwen2.5: q/k/v
    x = torch.randn(1, 16, model.hidden, dtype=torch.float16)
    with torch.inference_mode():
        stock = net(inputs_embeds=x).last_hidden_state
        patch = ops.patch_linear(net)
        patched = net(inputs_embeds=x).last_hidden_state
        patch.remove()
    assert len(patch.patched) == 2 * 7 and patch.skipped == ()
    assert model_bench.rel_diff(patched, stock) == 0.0  # on the CPU the patched layers call F.linear


def test_models_with_the_same_shapes_are_built_once() -> None:
    names = [m.name for m in model_bench.distinct_models(None)]
    assert "Mistral-7B" not in names and "Llama-3-8B" in names and len(names) == len(LLM_MODELS) - 1
    assert [m.name for m in model_bench.distinct_models(["Qwen2.5-7B", "Llama-3-8B"])] == ["Qwen2.5-7B", "Llama-3-8B"]
    with pytest.raises(SystemExit, match="unknown model"):
        model_bench.distinct_models(["GPT-5"])
    with pytest.raises(SystemExit, match="--tokens must be >= 1"):
        model_bench.parse_ints("0,16")


def test_table_reports_speedups_savings_and_capture_failures() -> None:
    Paired = model_bench.Paired
    ok = model_bench.Row("Llama-3-8B", 128, 2, 5, 0, 2, 40.0, Paired(1000.0, 800.0, 1.25, 0.05),
                         Paired(500.0, 460.0, 1.087, 0.012), 1e-3)
    failed = model_bench.Row("Qwen2.5-7B", 1, 2, 7, 0, 0, 10.0, Paired(900.0, 1000.0, 0.9, 0.01),
                             Paired.failed(RuntimeError("operation not permitted when stream is capturing\nmore")), None)
    text = model_bench.table([ok, failed])
    assert ("| Llama-3-8B | 128 | 5/0/2 | 1,000.0 / 800.0 | 1.250x | 500.0 / 460.0 | 1.087x | 1.2% | 40.0 / 40.0 "
            "| 1.0e-03 |") in text
    assert "| Qwen2.5-7B | 1 | 7/0/0 | 900.0 / 1,000.0 | 0.900x | n/a / n/a | n/a | n/a | 10.0 / n/a | n/a |" in text
    assert "- failed: graph Qwen2.5-7B M=1: RuntimeError: operation not permitted when stream is capturing" in text
    assert "compiled" not in text and "more" not in text
    compiled = dataclasses.replace(ok, compiled=Paired(450.0, 430.0, 1.05, 0.01), compiled_rel_diff=2e-3,
                                   compile_mode="reduce-overhead")
    text = model_bench.table([compiled, failed])
    assert text.splitlines()[0].endswith("| compiled (reduce-overhead) us: torch / cudal2 | compiled | rel. diff |")
    assert "| 1.0e-03 | 450.0 / 430.0 | 1.050x | 2.0e-03 |" in text
    assert text.splitlines()[3].endswith("| 10.0 / n/a | n/a | n/a | n/a | n/a |")  # no compiled figures
    assert all(line.count("|") == text.splitlines()[0].count("|") for line in text.splitlines()[:4])


def test_paired_figures_are_medians_and_the_median_ratio() -> None:
    p = model_bench.Paired.of([100.0, 110.0, 90.0], [50.0, 100.0, 45.0])
    assert (p.torch_us, p.op_us, p.speedup) == (100.0, 50.0, 2.0)  # ratios 2.0, 1.1, 2.0
    assert p.spread == pytest.approx(0.2) and p.error == ""


def test_routes_count_each_projection_of_a_layer_once() -> None:
    net = model_bench.build(scaled("Qwen2.5-0.5B", 8), layers=1, max_tokens=4, device="cpu")
    counts, saving = model_bench.routes(net.layers[0], 4)
    assert counts[ops.Route.TORCH] == 7 and saving == 0.0  # no CUDA device here: torch for every projection
