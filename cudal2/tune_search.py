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

Strategies see configs only through the family interface (cudal2/kernels/family.py): space(), default(), make().
Proposals may repeat or be invalid; the tuner skips repeats and prunes invalid ones before compiling. Every random
choice comes from the `random.Random` passed in, so a seed reproduces the proposal sequence (given the same
observations), which is what lets a re-run walk the configs it already measured and resume after them.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any

from cudal2.kernels.family import KernelFamily, config_name, config_params
from cudal2.sandbox.types import Task

EXPLORE = 0.25  # evolutionary: share of proposals sampled at random
ELITE = 4  # evolutionary: configs kept per shape as parents
CROSSOVER = 0.5  # evolutionary: share of children bred from two parents (then mutated once)
NEIGHBOUR = 0.7  # a mutated parameter moves to an adjacent value of its space tuple (else to any value)
TRANSFER_NEIGHBOURS = 2  # transfer: tuned shapes each target shape borrows configs from
TRANSFER_TOP = 2  # transfer: fastest configs taken from each of those shapes
MAX_NEIGHBOURS_SCANNED = 12  # transfer: nearest shapes looked at for configs that support the target


class Strategy(str, Enum):
    RANDOM = "random"
    EVOLUTIONARY = "evolutionary"
    TRANSFER = "transfer"


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


class TransferSearch(EvolutionarySearch):
    """Nearest-tuned-shape transfer (see the module docstring). `propose()` returns None when every pick is out.

    Observations before the first proposal (the tuner's warm start from the store) are the tuned shapes; the plan
    is fixed at the first proposal, later observations do not change it.
    """

    def __init__(self, families: tuple[KernelFamily, ...], rng: random.Random, targets: tuple[Task, ...]):
        super().__init__(families, rng)
        self.targets = targets
        self._plan: deque[Proposal] | None = None

    def propose(self) -> Proposal | None:  # type: ignore[override]
        if self._plan is None:
            self._plan = deque(self._make_plan())
        return self._plan.popleft() if self._plan else None

    def _make_plan(self) -> list[Proposal]:
        tuned = sorted(self.elites, key=lambda t: (t.m, t.n, t.k, t.acc.value))
        picks: dict[str, tuple[Candidate, int, list[Task]]] = {}  # name -> (candidate, best rank, target shapes)
        for target in self.targets:
            near = sorted((t for t in tuned if t.acc is target.acc), key=lambda t: (_log_distance(t, target),
                                                                                     t.m, t.n, t.k))
            lenders = 0
            for tuned_shape in near[:MAX_NEIGHBOURS_SCANNED]:
                # A neighbour's winners may refuse this shape (e.g. TMA needs K % 8 == 0): look further instead.
                usable = [c for _, c in self.elites[tuned_shape] if c.family.supports(c.cfg, target) is None]
                for rank, cand in enumerate(usable[:TRANSFER_TOP]):
                    prev_rank, shapes = picks.get(cand.name, (cand, rank, []))[1:]
                    if target not in shapes:
                        shapes.append(target)
                    picks[cand.name] = (cand, min(rank, prev_rank), shapes)
                lenders += bool(usable)
                if lenders == TRANSFER_NEIGHBOURS:
                    break
        ordered = sorted(picks.values(), key=lambda p: (p[1], -len(p[2]), p[0].name))
        return [Proposal(cand, None, tuple(shapes)) for cand, _, shapes in ordered]


def _log_distance(a: Task, b: Task) -> float:
    """Euclidean distance of two shapes in (log2 M, log2 N, log2 K): 64x64x64 is as far from 128x64x64 as 8192 from
    16384 in one dimension."""
    return math.dist((math.log2(a.m), math.log2(a.n), math.log2(a.k)), (math.log2(b.m), math.log2(b.n), math.log2(b.k)))


def make_strategy(kind: Strategy, families: tuple[KernelFamily, ...], seed: int,
                  targets: tuple[Task, ...] = ()) -> RandomSearch:
    """`targets`: the shapes of the run (the transfer strategy plans over them; the others ignore them)."""
    rng = random.Random(seed)
    if kind is Strategy.TRANSFER:
        return TransferSearch(families, rng, targets)
    return EvolutionarySearch(families, rng) if kind is Strategy.EVOLUTIONARY else RandomSearch(families, rng)
