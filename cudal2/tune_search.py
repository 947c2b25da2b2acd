"""Search strategies for `cudal2 tune`: which kernel config to try next.

    random        every family's default first, then uniform samples: a family, then each parameter
    evolutionary  the defaults first; then, with probability EXPLORE, a random sample, otherwise a child of the
                  elite of one shape (the ELITE fastest configs measured on it): crossover of two same-family
                  elites (each parameter from either) and/or a mutation of one or two parameters (usually to a
                  neighbouring value of the space, else to any value). A child carries its shape as `focus`.
    transfer      no search: carries what earlier runs measured (on any shapes in the store: a tuned sample, the
                  grid) over to a whole set (the 1000-shape grid, LLM shapes). Each target shape gets the
                  TRANSFER_TOP fastest configs that support it of each of its TRANSFER_NEIGHBOURS nearest measured
                  shapes that have one (distance in log2 M, N, K; at most MAX_NEIGHBOURS_SCANNED looked at); each
                  config is proposed once with all the shapes it was picked for, rank-0 picks first, so a run cut
                  short still covers every shape with its most likely winner. It stops when every pick is proposed.
    fill          no search either: re-cuts the store's winners to fill the GPU. Per family (those with
                  `decomposition` parameters), the FILL_PARENTS configs fastest on the most stored shapes are varied
                  in those parameters only (tile, K splits, scheduler: the same kernel body cut differently); each
                  target shape (where the family's fastest stored config is within FILL_FAMILY_GAP of the shape's
                  fastest, or that has none measured) gets the
                  FILL_PER_SHAPE cuts it has not measured with the lowest wave-model estimate
                  (`estimate_us`: whole waves of tiles over the SMs, K-split partials, L2 and HBM traffic), none
                  estimated slower than the cut of its fastest stored config of the family (FILL_MAX_EST_LOSS). It
                  aims at shapes with fewer tiles than SMs, where the winners of big shapes leave most of the GPU idle.
    neighbours    no search: one step of coordinate descent. Each target shape gets every config one parameter
                  away from its fastest stored config (each other value of each parameter of its family's space)
                  that survives prune() and supports the shape and is not yet measured on it; each config is
                  proposed once with all the shapes it neighbours, those it neighbours on the most shapes first.
                  It polishes shapes where random and evolutionary search left gaps (a new parameter such as sm90's
                  `raster` has never been tried on any of them). `vary` (tune --vary) limits the step to the named
                  parameters: a new one such as sm90's `epi_n` tried on each winner, without the whole neighbourhood.
    cublaslt      no search: each target shape gets the configs nearest to the cuBLASLt algorithm the harness
                  autotuned there (stored with the baselines; decoded by cudal2.sandbox.lt_algo): the same tile,
                  cluster and split-K where the family can express them (`like_cublaslt`), not yet measured there;
                  with tune --cublas-kernels, also those nearest to the kernel cuBLAS's default heuristic runs there
                  (the `cublas` baseline itself; cudal2.sandbox.cublas_kernels), which is not always cuBLASLt's.
                  cuBLAS's own choice is a strong start where it beats every config of the store.
    rerender      no search: after a family's code changed (so some configs render a source other than the one
                  stored), each target shape gets today's render of its RERENDER_PER_SHAPE fastest such stale configs
                  measured within RERENDER_WITHIN_US of the shape's fastest, once their time is divided by the
                  family's `rerender_gain` (1 where a change only shaves a constant; sm90's tiles that gained
                  one wide wgmma per K step may run up to 1.8x faster). Configs whose render is unchanged are
                  never proposed: the store already answers them.
    given         no search: the configs a list names (tune --configs FILE, one config name per line), in its order,
                  each on every target shape it supports; for configs designed by hand (or by a policy) for a set of
                  shapes, measured with the tuner's parallel compiles, store and resume.
    model         no search: a cost model (cudal2.cost_model: gradient-boosted trees on the configs' parameters, the
                  shapes and how each cut fits them) learns ln(time) from every result the store holds on this GPU,
                  then ranks, for each target shape, the configs measured on its MODEL_NEAREST nearest measured shapes
                  and every one-parameter change of its fastest config, none measured there yet; the MODEL_PER_SHAPE
                  predicted fastest are proposed, if predicted within MODEL_MAX_RATIO of the shape's fastest stored
                  time (a shape where nothing is predicted to win gets none). It learns what transfer copies and
                  neighbours enumerates, and spends the compiles where a win is predicted.

Strategies see configs only through the family interface (cudal2/kernels/family.py): space(), default(), make().
Proposals may repeat or be invalid; the tuner skips repeats and prunes invalid ones before compiling. Every random
choice comes from the `random.Random` passed in, so a seed reproduces the proposal sequence (given the same
observations), which is what lets a re-run walk the configs it already measured and resume after them.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from cudal2.cost_model import ConfigFeatures, GradientBoostedTrees
from cudal2.kernels.family import KernelFamily, Tiling, config_name, config_params
from cudal2.sandbox.lt_algo import LtAlgo
from cudal2.sandbox.types import Task

EXPLORE = 0.25  # evolutionary: share of proposals sampled at random
ELITE = 4  # evolutionary: configs kept per shape as parents
CROSSOVER = 0.5  # evolutionary: share of children bred from two parents (then mutated once)
NEIGHBOUR = 0.7  # a mutated parameter moves to an adjacent value of its space tuple (else to any value)
# transfer: each target borrows the TRANSFER_TOP fastest configs of each of its TRANSFER_NEIGHBOURS nearest tuned shapes.
# 6 x 1 rather than 2 x 2 (the same 2.8 picks per grid shape): left out of the H200 grid store one shape at a time,
# a pick was near-best on 95.4% of shapes against 90.9% (benchmarks/transfer_check.py, benchmarks/RESULTS.md).
TRANSFER_NEIGHBOURS = 6
TRANSFER_TOP = 1
MAX_NEIGHBOURS_SCANNED = 12  # transfer: nearest shapes looked at for configs that support the target
FILL_PARENTS = 3  # fill: per family, the configs fastest on the most stored shapes, whose cuts it varies
FILL_PER_SHAPE = 3  # fill: per family and target shape, the unmeasured cuts with the lowest estimate proposed
FILL_MAX_EST_LOSS = 1.0  # fill: no cut estimated slower than this times the shape's best stored cut of the family
# fill: a family is re-cut for a shape when its fastest stored config there is within this factor of the shape's
# fastest. On 256x512x16384 the best sm80 split-K (19.1 us) beat every sm90 config, but an sm90 atomic split-K that
# left half the SMs idle came within 1.15x: the family's better cuts deserve a measurement.
FILL_FAMILY_GAP = 1.25
# rerender: a stale config is re-measured on a shape when its stored time is within this many microseconds of the
# shape's fastest: the change that motivated it (sm90 stream-K flags cleared by a kernel node instead of a memset node,
# benchmarks/graph_gap.cu) saves at most ~1.7 us per call.
RERENDER_WITHIN_US = 2.0
RERENDER_PER_SHAPE = 8
# model: each target gets the MODEL_PER_SHAPE configs the cost model predicts fastest among those measured on its
# MODEL_NEAREST nearest measured shapes and the one-parameter changes of its fastest config, if predicted at most
# MODEL_MAX_RATIO times its fastest stored time. 2 picks: on held-out shapes the model's top 2 held a config within 3%
# of the best measured one on 79% of shapes (benchmarks/cost_model_check.py). 1.02: its median error on held-out
# results is 4% (p90 15%), so a config predicted a little slower than the incumbent may well beat it.
MODEL_PER_SHAPE = 2
MODEL_NEAREST = 12
MODEL_MAX_RATIO = 1.02
MODEL_MIN_RESULTS = 200  # fewer results than this teach the model nothing worth a compile


class Strategy(str, Enum):
    RANDOM = "random"
    EVOLUTIONARY = "evolutionary"
    TRANSFER = "transfer"
    FILL = "fill"
    RERENDER = "rerender"
    NEIGHBOURS = "neighbours"
    CUBLASLT = "cublaslt"
    MODEL = "model"
    GIVEN = "given"

    @property
    def plans_from_store(self) -> bool:
        """Plans once from every shape the store holds (the tuner's warm start feeds it all of them)."""
        return self in (Strategy.TRANSFER, Strategy.FILL, Strategy.MODEL)

    @property
    def reads_cublaslt_algos(self) -> bool:
        """Needs the cuBLASLt algorithms the store holds for the targets (RandomSearch.observe_cublaslt)."""
        return self is Strategy.CUBLASLT


@dataclass(frozen=True)
class Candidate:
    """One config of one family."""

    family: KernelFamily
    cfg: Any

    @property
    def name(self) -> str:
        return config_name(self.family, self.cfg)


@dataclass(frozen=True)
class Proposal:
    candidate: Candidate
    focus: Task | None  # the shape whose elite this child descends from; None: for every shape
    shapes: tuple[Task, ...] | None = None  # only these shapes (transfer); None: the tuner's whole set


class RandomSearch:
    """Uniform sampling after the families' defaults."""

    # How many of each stored shape's fastest configs the tuner's warm start passes to observe().
    warm_configs = ELITE

    def __init__(self, families: tuple[KernelFamily, ...], rng: random.Random):
        self.families = families
        self.rng = rng
        self._seeds = deque(Candidate(f, f.default()) for f in families)

    def propose(self) -> Proposal:
        if self._seeds:
            return Proposal(self._seeds.popleft(), None)
        return Proposal(self._sample(), None)

    def observe(self, candidate: Candidate, task: Task, median_us: float) -> None:
        """A measured (ok) time of `candidate` on `task`, microseconds; random search ignores it."""

    def observe_stored(self, candidate: Candidate, task: Task, median_us: float, current: bool) -> None:
        """A time from the store (the tuner's warm start); `current`: the stored source is the one `candidate`
        renders today (False after its family's code changed)."""
        self.observe(candidate, task, median_us)

    def observe_cublaslt(self, task: Task, lt: LtAlgo) -> None:
        """The cuBLASLt algorithm the harness autotuned on `task`; only the cublaslt strategy plans from it."""

    def _sample(self) -> Candidate:
        family = self.rng.choice(self.families)
        params = {name: self.rng.choice(values) for name, values in family.space().items()}
        return Candidate(family, family.make(params))


class EvolutionarySearch(RandomSearch):
    """Mutation and crossover of the per-shape elites (see the module docstring)."""

    def __init__(self, families: tuple[KernelFamily, ...], rng: random.Random):
        super().__init__(families, rng)
        self.elites: dict[Task, list[tuple[float, Candidate]]] = {}

    def observe(self, candidate: Candidate, task: Task, median_us: float) -> None:
        ranked = [e for e in self.elites.get(task, []) if e[1].name != candidate.name]
        ranked.append((median_us, candidate))
        ranked.sort(key=lambda e: (e[0], e[1].name))
        self.elites[task] = ranked[:ELITE]

    def propose(self) -> Proposal:
        if self._seeds or not self.elites or self.rng.random() < EXPLORE:
            return super().propose()
        focus = self.rng.choice(sorted(self.elites, key=lambda t: (t.m, t.n, t.k, t.acc.value)))
        parents = [c for _, c in self.elites[focus]]
        first = self.rng.choice(parents)
        mates = [c for c in parents if c.family is first.family and c.name != first.name]
        params = config_params(first.cfg)
        if mates and self.rng.random() < CROSSOVER:
            other = config_params(self.rng.choice(mates).cfg)
            params = {k: self.rng.choice((v, other[k])) for k, v in params.items()}
            params = self._mutate(first.family, params, count=1)
        else:
            params = self._mutate(first.family, params, count=self.rng.choice((1, 2)))
        return Proposal(Candidate(first.family, first.family.make(params)), focus)

    def _mutate(self, family: KernelFamily, params: dict[str, Any], count: int) -> dict[str, Any]:
        space = family.space()
        out = dict(params)
        for name in self.rng.sample(sorted(space), k=min(count, len(space))):
            values = space[name]
            i = values.index(out[name])
            if self.rng.random() < NEIGHBOUR:
                options = [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)]
            else:
                options = [v for v in values if v != out[name]]
            if options:
                out[name] = self.rng.choice(options)
        return out


class PlannedSearch(EvolutionarySearch):
    """A search that plans every proposal at once, from what the store holds (the warm start observes every stored
    shape before the first proposal); later observations do not change the plan. `propose()` returns None when
    every planned proposal is out. Each planned config is proposed once with every target shape it was picked for,
    the configs picked at rank 0 for some shape first, then those picked for the most shapes, so that a run cut
    short still gives every shape its most likely winner."""

    def __init__(self, families: tuple[KernelFamily, ...], rng: random.Random, targets: tuple[Task, ...]):
        super().__init__(families, rng)
        self.targets = targets
        self._plan: deque[Proposal] | None = None

    def propose(self) -> Proposal | None:  # type: ignore[override]
        if self._plan is None:
            picks = _Picks()
            self._pick(picks)
            self._plan = deque(picks.proposals())
        return self._plan.popleft() if self._plan else None

    def _pick(self, picks: _Picks) -> None:
        raise NotImplementedError


class _Picks:
    """Config name -> (candidate, its best rank over the shapes that picked it, those shapes in pick order)."""

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[Candidate, int, list[Task]]] = {}

    def add(self, cand: Candidate, rank: int, target: Task) -> None:
        _, best_rank, shapes = self._by_name.get(cand.name, (cand, rank, []))
        if target not in shapes:
            shapes.append(target)
        self._by_name[cand.name] = (cand, min(rank, best_rank), shapes)

    def proposals(self) -> list[Proposal]:
        ordered = sorted(self._by_name.values(), key=lambda p: (p[1], -len(p[2]), p[0].name))
        return [Proposal(cand, None, tuple(shapes)) for cand, _, shapes in ordered]


class TransferSearch(PlannedSearch):
    """Nearest-tuned-shape transfer (see the module docstring)."""

    def _pick(self, picks: _Picks) -> None:
        tuned = sorted(self.elites, key=lambda t: (t.m, t.n, t.k, t.acc.value))
        for target in self.targets:
            near = sorted((t for t in tuned if t.acc is target.acc), key=lambda t: (log_distance(t, target),
                                                                                     t.m, t.n, t.k))
            lenders = 0
            for tuned_shape in near[:MAX_NEIGHBOURS_SCANNED]:
                # A neighbour's winners may refuse this shape (e.g. TMA needs K % 8 == 0): look further instead.
                usable = [c for _, c in self.elites[tuned_shape] if c.family.supports(c.cfg, target) is None]
                for rank, cand in enumerate(usable[:TRANSFER_TOP]):
                    picks.add(cand, rank, target)
                lenders += bool(usable)
                if lenders == TRANSFER_NEIGHBOURS:
                    break


class FillSearch(PlannedSearch):
    """Re-cut the store's winners to fill the GPU (see the module docstring)."""

    warm_configs = 1_000_000  # every stored config: a family's fastest on a shape may lie far below the elite

    def __init__(self, families: tuple[KernelFamily, ...], rng: random.Random, targets: tuple[Task, ...],
                 arch: str, sms: int):
        super().__init__(families, rng, targets)
        self.arch, self.sms = arch, sms
        # (shape, family name) -> the family's configs measured there, fastest first: (median us, candidate).
        self._measured: dict[tuple[Task, str], list[tuple[float, Candidate]]] = {}

    def observe(self, candidate: Candidate, task: Task, median_us: float) -> None:
        super().observe(candidate, task, median_us)
        key = (task, candidate.family.name)
        mine = [e for e in self._measured.get(key, []) if e[1].name != candidate.name] + [(median_us, candidate)]
        self._measured[key] = sorted(mine, key=lambda e: (e[0], e[1].name))

    def _pick(self, picks: _Picks) -> None:
        for family in self.families:
            if not family.decomposition:
                continue
            # (cut, config) of every variant, the parents' in their order: computed once for all targets.
            variants = [(family.tiling(v.cfg), v) for parent in self._parents(family) for v in self._variants(parent)]
            for target in self.targets:
                elite = self.elites.get(target, [])
                own = self._measured.get((target, family.name), [])
                if elite and not (own and own[0][0] <= elite[0][0] * FILL_FAMILY_GAP):
                    continue  # the family is far behind on this shape: its cuts are unlikely to win either
                for rank, cand in enumerate(self._cuts(family, variants, target, [c for _, c in own])):
                    picks.add(cand, rank, target)

    def _cuts(self, family: KernelFamily, variants: list[tuple[Tiling, Candidate]], target: Task,
              own: list[Candidate]) -> list[Candidate]:
        """The FILL_PER_SHAPE distinct cuts for `target` with the lowest estimates, none measured on it (`own`: the
        family's configs measured there, fastest first) and none estimated more than FILL_MAX_EST_LOSS slower than
        the cut of its fastest stored config of this family."""
        by_tiling: dict[Tiling, Candidate] = {}  # one config per cut: the first parent's that takes the shape
        for tiling, v in variants:
            if tiling not in by_tiling and family.supports(v.cfg, target) is None:
                by_tiling[tiling] = v
        limit = estimate_us(family.tiling(own[0].cfg), target, self.sms) * FILL_MAX_EST_LOSS if own else math.inf
        measured = {c.name for c in own}
        # Distinct cuts of the output and K only: two K-block depths of one cut estimate alike, and would crowd out
        # a different cut.
        seen: set[tuple[int, int, int, bool, bool, bool, bool]] = set()
        fresh = []
        estimated = sorted(((estimate_us(t, target, self.sms), c.name, t, c) for t, c in by_tiling.items()),
                           key=lambda e: e[:2])
        for est, _, t, cand in estimated:
            key = (t.bm, t.bn, t.splits, t.stream_k, t.cluster_reduce, t.last_arrival, t.spread)
            if est <= limit and cand.name not in measured and key not in seen:
                seen.add(key)
                fresh.append(cand)
        return fresh[:FILL_PER_SHAPE]

    def _parents(self, family: KernelFamily) -> list[Candidate]:
        """The family's FILL_PARENTS configs that are fastest on the most stored shapes; its default if none."""
        wins: dict[str, tuple[int, Candidate]] = {}
        for elite in self.elites.values():
            best = elite[0][1]
            if best.family is family:
                wins[best.name] = (wins.get(best.name, (0, best))[0] + 1, best)
        ranked = sorted(wins.values(), key=lambda w: (-w[0], w[1].name))
        return [c for _, c in ranked[:FILL_PARENTS]] or [Candidate(family, family.default())]

    def _variants(self, parent: Candidate) -> list[Candidate]:
        """Every config that differs from `parent` only in its family's decomposition parameters and survives
        prune() on this arch, the parent itself included."""
        family, space = parent.family, parent.family.space()
        out = []
        for values in itertools.product(*(space[name] for name in family.decomposition)):
            params = {**config_params(parent.cfg), **dict(zip(family.decomposition, values, strict=True))}
            cfg = family.make(params)
            if family.prune(cfg, self.arch) is None:
                out.append(Candidate(family, cfg))
        return out


class RerenderSearch(PlannedSearch):
    """Today's renders of stale stored configs that were close to each target's fastest (see the module docstring)."""

    warm_configs = 1_000_000  # every stored config: a stale one may sit far down a shape's list

    def __init__(self, families: tuple[KernelFamily, ...], rng: random.Random, targets: tuple[Task, ...]):
        super().__init__(families, rng, targets)
        self._fastest: dict[Task, float] = {}  # microseconds, any render
        self._stale: dict[Task, dict[str, tuple[float, Candidate]]] = {}  # shape -> name -> fastest stale time
        self._current: dict[Task, set[str]] = {}  # shape -> names whose current render is measured there

    def observe_stored(self, candidate: Candidate, task: Task, median_us: float, current: bool) -> None:
        super().observe_stored(candidate, task, median_us, current)
        self._fastest[task] = min(self._fastest.get(task, median_us), median_us)
        if current:
            self._current.setdefault(task, set()).add(candidate.name)
            return
        stale = self._stale.setdefault(task, {})
        if candidate.name not in stale or median_us < stale[candidate.name][0]:
            stale[candidate.name] = (median_us, candidate)

    def _pick(self, picks: _Picks) -> None:
        for target in self.targets:
            done = self._current.get(target, set())
            stale = sorted((us, name, c) for name, (us, c) in self._stale.get(target, {}).items() if name not in done)
            # A stale time over the family's gain for today's render: what that render may reach.
            close = [c for us, _, c in stale
                     if us / c.family.rerender_gain(c.cfg) <= self._fastest[target] + RERENDER_WITHIN_US]
            for rank, cand in enumerate(close[:RERENDER_PER_SHAPE]):
                picks.add(cand, rank, target)


class _FreshPlan(PlannedSearch):
    """A planned search that proposes a config for a shape only if it was never measured there (any render)."""

    warm_configs = 1_000_000  # every stored config: one measured far down a shape's list is not proposed again

    def __init__(self, families: tuple[KernelFamily, ...], rng: random.Random, targets: tuple[Task, ...]):
        super().__init__(families, rng, targets)
        self._measured: dict[Task, set[str]] = {}  # shape -> names of the configs measured there

    def observe(self, candidate: Candidate, task: Task, median_us: float) -> None:
        super().observe(candidate, task, median_us)
        self._measured.setdefault(task, set()).add(candidate.name)

    def _fresh(self, cand: Candidate, target: Task) -> bool:
        """Not measured on `target` yet, and its family takes the shape."""
        return cand.name not in self._measured.get(target, set()) and cand.family.supports(cand.cfg, target) is None


class NeighboursSearch(_FreshPlan):
    """Every valid one-parameter change of each target's fastest stored config (see the module docstring)."""

    def __init__(self, families: tuple[KernelFamily, ...], rng: random.Random, targets: tuple[Task, ...], arch: str,
                 vary: tuple[str, ...] = ()):
        super().__init__(families, rng, targets)
        self.arch = arch
        self.vary = vary  # the parameters a step may change; () = all of the family's

    def _pick(self, picks: _Picks) -> None:
        neighbours: dict[str, list[Candidate]] = {}  # per incumbent: shapes often share one
        for target in self.targets:
            if target not in self.elites:
                continue  # nothing measured there: no incumbent to step from (transfer or fill give it one)
            incumbent = self.elites[target][0][1]
            if incumbent.name not in neighbours:
                neighbours[incumbent.name] = one_step(incumbent, self.arch, self.vary)
            for cand in neighbours[incumbent.name]:
                if self._fresh(cand, target):
                    picks.add(cand, 0, target)


def one_step(parent: Candidate, arch: str, vary: tuple[str, ...] = ()) -> list[Candidate]:
    """The configs that differ from `parent` in one parameter (one of `vary`; () = any), with the fields the new
    config's kind ignores settled (`KernelFamily.settle`: a pingpong parent with swizzle 4 steps to its `basic` twin,
    swizzle 1), that survive prune() on `arch`; each once, never the parent itself."""
    family, space = parent.family, parent.family.space()
    params = config_params(parent.cfg)
    out: dict[Any, Candidate] = {}  # by config: two steps may settle to one
    for name, values in space.items():
        if vary and name not in vary:
            continue
        for value in values:
            if value == params[name]:
                continue
            cfg = family.settle(family.make({**params, name: value}))
            if cfg != parent.cfg and cfg not in out and family.prune(cfg, arch) is None:
                out[cfg] = Candidate(family, cfg)
    return list(out.values())


class GivenSearch(PlannedSearch):
    """The configs of a list, in its order, on every target shape each supports (see the module docstring)."""

    def __init__(self, families: tuple[KernelFamily, ...], rng: random.Random, targets: tuple[Task, ...],
                 given: tuple[Candidate, ...]):
        super().__init__(families, rng, targets)
        self.given = given

    def _pick(self, picks: _Picks) -> None:
        for rank, cand in enumerate(self.given):
            for target in self.targets:
                if cand.family.supports(cand.cfg, target) is None:
                    picks.add(cand, rank, target)


class CublasLtSearch(_FreshPlan):
    """The configs nearest to cuBLASLt's autotuned algorithm on each target (see the module docstring)."""

    def __init__(self, families: tuple[KernelFamily, ...], rng: random.Random, targets: tuple[Task, ...]):
        super().__init__(families, rng, targets)
        self._algos: dict[Task, list[LtAlgo]] = {}  # cuBLASLt's autotuned, cuBLAS's heuristic kernel: each observed

    def observe_cublaslt(self, task: Task, lt: LtAlgo) -> None:
        self._algos.setdefault(task, []).append(lt)

    def _pick(self, picks: _Picks) -> None:
        for target in self.targets:
            for algo in self._algos.get(target, ()):  # none: no cuBLASLt baseline stored there yet
                for family in self.families:
                    for rank, cfg in enumerate(family.like_cublaslt(algo)):  # rank: most faithful first
                        cand = Candidate(family, cfg)
                        if self._fresh(cand, target):
                            picks.add(cand, rank, target)


class ModelSearch(_FreshPlan):
    """The configs the learned cost model predicts fastest on each target (see the module docstring)."""

    def __init__(self, families: tuple[KernelFamily, ...], rng: random.Random, targets: tuple[Task, ...], arch: str,
                 sms: int):
        super().__init__(families, rng, targets)
        self.arch, self.sms = arch, sms
        self._times: dict[tuple[Task, str], tuple[Candidate, float]] = {}  # fastest observed, microseconds
        # After planning: each target's picks with their predicted microseconds, first pick first.
        self.forecast: dict[Task, list[tuple[Candidate, float]]] = {}

    def observe(self, candidate: Candidate, task: Task, median_us: float) -> None:
        super().observe(candidate, task, median_us)
        kept = self._times.get((task, candidate.name))
        if kept is None or median_us < kept[1]:
            self._times[(task, candidate.name)] = (candidate, median_us)

    def _pick(self, picks: _Picks) -> None:
        if len(self._times) < MODEL_MIN_RESULTS:
            return  # nothing to learn from: the tuner refuses such a run before it starts (tune.Tuner.run)
        features = ConfigFeatures(self.families, estimate_us, self.sms)
        results = [(cand, task, us) for (task, _), (cand, us) in self._times.items()]
        model = GradientBoostedTrees().fit(features.matrix([(cand, task) for cand, task, _ in results]),
                                           np.log([us for _, _, us in results]))
        by_shape: dict[Task, list[Candidate]] = {}
        for cand, task, _ in results:
            by_shape.setdefault(task, []).append(cand)
        valid: dict[str, bool] = {}  # config name -> survives prune() on this arch
        pools = [(target, self._pool(target, by_shape, valid)) for target in self.targets]
        pairs = [(cand, target) for target, pool in pools for cand in pool]
        predicted = np.exp(model.predict(features.matrix(pairs))).tolist() if pairs else []
        start = 0
        for target, pool in pools:
            best = self.elites[target][0][0] if target in self.elites else math.inf
            mine, start = predicted[start:start + len(pool)], start + len(pool)
            ranked = sorted(((us, cand.name, cand) for cand, us in zip(pool, mine, strict=True)), key=lambda e: e[:2])
            hopeful = [(cand, us) for us, _, cand in ranked if us <= best * MODEL_MAX_RATIO][:MODEL_PER_SHAPE]
            self.forecast[target] = hopeful
            for rank, (cand, _) in enumerate(hopeful):
                picks.add(cand, rank, target)

    def _pool(self, target: Task, by_shape: dict[Task, list[Candidate]], valid: dict[str, bool]) -> list[Candidate]:
        """What the model ranks for `target`: every config measured on its MODEL_NEAREST nearest measured shapes
        (`by_shape`) and every one-parameter change of its fastest stored config, none measured on it yet, each
        once. `valid` caches prune() by config name across targets."""
        near = sorted((t for t in by_shape if t.acc is target.acc and t != target),
                      key=lambda t: (log_distance(t, target), t.m, t.n, t.k))[:MODEL_NEAREST]
        pool = {c.name: c for shape in near for c in by_shape[shape]}
        if target in self.elites:
            pool.update((c.name, c) for c in one_step(self.elites[target][0][1], self.arch))
        out = []
        for name, cand in pool.items():
            if name not in valid:
                valid[name] = cand.family.prune(cand.cfg, self.arch) is None
            if valid[name] and self._fresh(cand, target):
                out.append(cand)
        return out


# The wave model's H100/H200-class figures (per SM, microseconds). It only ranks the cuts of one kernel body on one
# shape, which the GPU then measures: the numbers need the right proportions, not precision. TILE_US, L2 and SPLIT_US
# are fitted on the train split of the H200 grid store and checked on its held-out split with
# benchmarks/wave_model_check.py (benchmarks/RESULTS.md): TILE_US absorbs what one more wave costs beyond its MMAs.
SM_FLOP_PER_US = 7.5e6  # dense fp16 tensor-core peak per SM: ~990 TFLOP/s over 132 SMs
TILE_US = 4.0  # per output tile a CTA takes: filling the pipeline, the epilogue's stores, the wave's tail
L2_BYTES_PER_US = 10.0e6  # operand tiles re-read from L2 by every CTA that needs them, all SMs together
HBM_BYTES_PER_US = 4.0e6  # A, B and C once from and to HBM
SPLIT_US = 5.0  # a split (or stream-K) reduction's fixed cost: a second kernel or the fix-up's flags and waits
# Split-K summed inside a thread-block cluster (sm80 family, reduce=cluster): two cluster barriers, partials read once
# from the peers' shared memory. Not fitted (no such kernel was measured yet): a guess of the same proportions.
CLUSTER_SYNC_US = 1.0
DSMEM_BYTES_PER_US = 20.0e6
# An ordered (deterministic) workspace reduction: each K range of a tile waits for the one before it to add its
# partial, so the ranges' adds run one after another, each a flag round trip plus a tile read and written by one CTA.
SERIAL_STEP_US = 1.0
# A last-arrival reduction (small family's grid_k, sm80's reduce=last): no second kernel, one ticket round trip, then
# the last CTA of a tile reads the partials from L2. Not fitted; as built it measured 2.0-2.6 us slower than the same
# 16x32 tiling summed in a cluster (64x64x2048, 64x64x8192 on the H200: benchmarks/RESULTS.md, thirty-seventh session).
LAST_ARRIVAL_US = CLUSTER_SYNC_US + 2.0
# The reading SM takes the tile's partials at one SM's L2 bandwidth (~64 B per clock at ~1.9 GHz; not fitted), so a
# large tile cut many ways costs its last CTA microseconds. Spread (the small family's grid_k with spread): every CTA
# of the tile waits for the last arrival and reads a 1/splits share of each partial, so no one SM reads them all; the
# cooperative launch and the wait cost ~1.5 us more than the last arrival's ticket (graph_gap.cu on an H100: spread
# wait +2.27 us over a cooperative empty launch, itself +0.20 over a plain one, against +1.00 for the ticket).
SM_L2_BYTES_PER_US = 0.12e6
SPREAD_WAIT_US = 1.5


def estimate_us(t: Tiling, task: Task, sms: int) -> float:
    """Estimated time of a kernel cut as `t` on `task` with `sms` SMs, microseconds: the slowest of compute in whole
    waves (fractional under stream-K), operand traffic from L2, and the HBM floor; plus the split-K reduction, whose
    fp32 partials go to and come back from the workspace (one after another when the reduction is ordered)."""
    m, n, k = task.m, task.n, task.k
    tiles = math.ceil(m / t.bm) * math.ceil(n / t.bn)
    units = tiles * t.splits  # CTA work units
    kblocks = math.ceil(math.ceil(k / t.bk) / t.splits)  # K blocks per unit
    kblock_us = 2 * t.bm * t.bn * t.bk / SM_FLOP_PER_US
    if t.stream_k:
        compute = units * kblocks * kblock_us / sms + math.ceil(units / sms) * TILE_US
    else:
        compute = math.ceil(units / sms) * (kblocks * kblock_us + TILE_US)
    l2 = 2 * (m * k * math.ceil(n / t.bn) + n * k * math.ceil(m / t.bm)) / L2_BYTES_PER_US
    hbm = 2 * (m * k + n * k + m * n) / HBM_BYTES_PER_US
    # Partial fp32 tiles through the workspace: one per unit under split-K; under stream-K about one per SM when the
    # last wave is shared out (units not a multiple of the SMs), none otherwise.
    partial_tiles = units if t.splits > 1 else (sms if t.stream_k and units % sms else 0)
    if not partial_tiles:
        reduce = 0.0
    elif t.cluster_reduce:  # parked in shared memory, read over the cluster's SM-to-SM network: no second pass
        reduce = CLUSTER_SYNC_US + 4 * partial_tiles * t.bm * t.bn / DSMEM_BYTES_PER_US
    elif t.last_arrival:  # through L2 to the tile's last CTA (or with spread to all of them), in the same launch
        one_sm_reads = 4 * t.bm * t.bn * (1 if t.spread else t.splits)  # bytes: a share of each partial, or all
        reduce = (LAST_ARRIVAL_US + (SPREAD_WAIT_US if t.spread else 0.0) + one_sm_reads / SM_L2_BYTES_PER_US
                  + 2 * 4 * partial_tiles * t.bm * t.bn / L2_BYTES_PER_US)
    else:
        reduce = SPLIT_US + 2 * 4 * partial_tiles * t.bm * t.bn / L2_BYTES_PER_US
        if t.serial_reduce:  # the chain of a tile's K ranges (stream-K: about two peers per shared tile)
            reduce += (t.splits - 1 if t.splits > 1 else 1) * SERIAL_STEP_US
    return max(compute, l2, hbm) + reduce


def log_distance(a: Task, b: Task) -> float:
    """Euclidean distance of two shapes in (log2 M, log2 N, log2 K): 64x64x64 is as far from 128x64x64 as 8192 from
    16384 in one dimension."""
    return math.dist((math.log2(a.m), math.log2(a.n), math.log2(a.k)), (math.log2(b.m), math.log2(b.n), math.log2(b.k)))


def make_strategy(kind: Strategy, families: tuple[KernelFamily, ...], seed: int, targets: tuple[Task, ...] = (),
                  arch: str = "sm_90a", sms: int = 132, vary: tuple[str, ...] = (),
                  given: tuple[Candidate, ...] = ()) -> RandomSearch:
    """`targets`: the shapes of the run (the planned strategies plan over them; the others ignore them); `arch`:
    the compile target fill and neighbours prune for; `sms`: the SM count fill's wave model fills; `vary`: the
    parameters neighbours steps along (() = all); `given`: the configs the given strategy proposes."""
    rng = random.Random(seed)
    if kind is Strategy.GIVEN:
        return GivenSearch(families, rng, targets, given)
    if kind is Strategy.TRANSFER:
        return TransferSearch(families, rng, targets)
    if kind is Strategy.FILL:
        return FillSearch(families, rng, targets, arch, sms)
    if kind is Strategy.RERENDER:
        return RerenderSearch(families, rng, targets)
    if kind is Strategy.NEIGHBOURS:
        return NeighboursSearch(families, rng, targets, arch, vary)
    if kind is Strategy.CUBLASLT:
        return CublasLtSearch(families, rng, targets)
    if kind is Strategy.MODEL:
        return ModelSearch(families, rng, targets, arch, sms)
    return EvolutionarySearch(families, rng) if kind is Strategy.EVOLUTIONARY else RandomSearch(families, rng)
