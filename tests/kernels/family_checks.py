"""Checks every generated kernel family must pass, shared by the per-family test files.

Each function takes the family (and configs) and asserts; the test files choose the representative samples.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from cudal2.kernels.family import BadConfig, KernelFamily, config_name, config_params
from cudal2.sandbox.evaluator import EvalOptions, Evaluator
from cudal2.sandbox.static_check import check_source
from cudal2.sandbox.types import Acc, Status, Task
from tests.kernels import emulator

# Odd shapes for the CPU emulator: (M, N, K, (offset of A, B, C in halves)). Aligned K with odd M/N; K not a
# multiple of 8 (scalar/predicated path); M = 1; K = 1; misaligned pointers with an aligned K (forces the slow
# path); many tiles (rasterisation); a long K (split-K ranges, pipeline wrap-around).
EMU_SHAPES = (
    (77, 100, 336, (0, 0, 0)),
    (33, 17, 333, (0, 0, 0)),
    (1, 40, 24, (0, 0, 0)),
    (5, 9, 1, (0, 0, 0)),
    (20, 30, 512, (1, 8, 1)),
    (260, 300, 40, (0, 0, 0)),
    (16, 24, 1000, (0, 0, 0)),
)


def every_value_renders(family: KernelFamily) -> None:
    """Each value of each parameter (the rest at the default) renders a source the static rules accept, with the
    value visible as a named constant or in the header."""
    base = config_params(family.default())
    for name, values in family.space().items():
        for value in values:
            cfg = family.make({**base, name: value})
            source = family.render(cfg)
            assert config_name(family, cfg) in source
            assert 'extern "C" int cudal2_hgemm(' in source
            assert check_source(source) == [], (name, value)


def rejects_bad_params(family: KernelFamily) -> None:
    base = config_params(family.default())
    some = next(iter(base))
    with pytest.raises(BadConfig, match="unknown parameter"):
        family.make({**base, "bogus": 1})
    with pytest.raises(BadConfig, match=some):
        family.make({**base, some: 12345})
    with pytest.raises(BadConfig, match="missing"):
        family.make({k: v for k, v in base.items() if k != some})
    with pytest.raises(BadConfig, match="acc"):
        family.make({**base, "acc": "fp64"})
    with pytest.raises(BadConfig):
        family.render(object())
    assert family.make({**base, "acc": "fp16"}).acc is Acc.FP16  # enum values as strings are accepted


def fp16_only_for_fp16_tasks(family: KernelFamily) -> None:
    fp16 = replace(family.default(), acc=Acc.FP16)
    assert "fp16 accumulation" in family.supports(fp16, Task(64, 64, 64, Acc.FP32))
    assert family.supports(fp16, Task(64, 64, 64, Acc.FP16)) is None
    assert family.supports(family.default(), Task(77, 1000, 333, Acc.FP32)) is None


def compile_sample(family: KernelFamily, configs: list, cache_dir: Path) -> None:
    """Static rules, nvcc and the link check (Evaluator.prepare, as `cudal2 eval --compile-only`) pass for every
    config on every target of the family that does not prune it (each config has one), 2 compiles at a time; the
    fast kernel does not spill."""
    jobs = [(cfg, arch) for cfg in configs for arch in family.archs if family.prune(cfg, arch) is None]
    for cfg in configs:
        assert any(c is cfg for c, _ in jobs), (config_name(family, cfg), [family.prune(cfg, a) for a in family.archs])

    def prepare(job):
        cfg, arch = job
        ev = Evaluator(EvalOptions(compile_only=True, arch=arch, cache_dir=cache_dir))
        return ev.prepare(family.render(cfg), [Task(77, 1000, 333)])

    with ThreadPoolExecutor(2) as pool:
        for (cfg, arch), prep in zip(jobs, pool.map(prepare, jobs), strict=True):
            name = f"{config_name(family, cfg)} for {arch}"
            assert prep.final is not None and prep.final.shapes[0].status == Status.COMPILED, \
                (name, prep.final.shapes[0].reason if prep.final else None, prep.compile and prep.compile.log[:2000])
            assert prep.compile.kernels, name
            fastest = min(prep.compile.kernels, key=lambda k: k.registers)  # the aligned fast path uses fewest
            assert fastest.spill_store_bytes == 0, name


def emulate(family: KernelFamily, cfg, workdir: Path, shapes=EMU_SHAPES, calls: int = 1,
            source: str | None = None, sms: int = 132) -> None:
    """The rendered kernel (or `source`), run by the CPU emulator, matches the reference on odd shapes, writes nothing
    outside C and the workspace, reads no shared memory before its copy landed and has no ldmatrix bank conflicts;
    with `calls` > 1, every call gives the first one's C bit for bit (state a call leaves behind, or an order its
    blocks run in, shows here). `sms`: the emulated GPU's SMs (emulator.run)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not on PATH (the CPU emulator needs it)")
    exe = emulator.build(family.render(cfg) if source is None else source, cfg.acc, workdir)
    tol = 2e-3 if cfg.acc is Acc.FP32 else 2e-2  # fp32 accumulate: only half rounding of C differs
    for m, n, k, offsets in shapes:
        r = emulator.run(exe, m, n, k, offsets, calls=calls, sms=sms)
        where = f"{config_name(family, cfg)} on {m}x{n}x{k} offsets {offsets}"
        assert r.rc == 0, where
        assert r.nonfinite == 0 and r.rel_err <= tol, (where, r)
        assert r.guard_bad == 0, (where, "wrote outside C or the workspace")
        assert r.bank_conflicts == 0, (where, "ldmatrix bank conflicts")
        assert r.mismatch == 0, (where, f"a later call's C differs from the first's in {r.mismatch} halves")


def emulate_with_tickets(family: KernelFamily, cfg, workdir: Path, tickets: int, shapes) -> None:
    """emulate(), two calls per shape, of `cfg`'s source with its MAX_TICKETS (the last-arrival reductions' ticket
    count) set to `tickets`: shapes of more tiles than that take the path for shapes over the real count."""
    real = "constexpr int MAX_TICKETS = 65536;"
    source = family.render(cfg)
    assert real in source, "no MAX_TICKETS of 65536 in the source"
    emulate(family, cfg, workdir, shapes, calls=2, source=source.replace(real, f"constexpr int MAX_TICKETS = {tickets};"))


def emulate_many(family: KernelFamily, configs: list, workdir: Path) -> None:
    """emulate() for several configs, 2 at a time."""
    def one(i_cfg):
        i, cfg = i_cfg
        path = workdir / str(i)
        path.mkdir()
        emulate(family, cfg, path)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, enumerate(configs)))
