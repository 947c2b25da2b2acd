"""The contract every generated kernel family follows (sm80 mma.sync, sm90 wgmma/TMA, small-shape).

A family is a parameterised HGEMM generator. The tuner (`cudal2 tune`) and a policy see only this interface:

    family.space()          -> {parameter name: allowed values}   the search space, for random / evolutionary search
    family.default()        -> Config                              a good general-purpose config (the tuner's start)
    family.make(params)     -> Config                              a frozen dataclass; raises BadConfig on an unknown
                                                                   parameter or a value outside the space
    family.prune(cfg, arch) -> str | None                          why this config cannot work on `arch` (shared
                                                                   memory, registers, divisibility...), decided
                                                                   before compiling; None = worth compiling
    family.render(cfg)      -> str                                 a readable .cu source following the candidate
                                                                   contract (README.md); one compile serves every
                                                                   shape (M, N, K >= 1 handled by the kernel itself)
    family.supports(cfg, task) -> str | None                       why this config refuses a shape at run time (e.g.
                                                                   K % 8 != 0 for 16-byte loads), or None
    family.tiling(cfg)      -> Tiling                              how the config cuts the work over CTAs (output
                                                                   tile, K block, K splits, stream-K), for a wave model
    family.decomposition    -> tuple of parameter names            the parameters that only change that cut (tile,
                                                                   split, scheduler), which the `fill` search varies;
                                                                   () when none can change without changing the code
    family.rerender_gain(cfg) -> float                             how much faster today's render may run than one
                                                                   stored before a change of the family's code

Configs are plain frozen dataclasses so that they hash, compare and print; `config_name(cfg)` gives a stable short
name (the tuner keys its bookkeeping by it, the store keys results by source hash).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any, Protocol

from cudal2.sandbox.lt_algo import LtAlgo
from cudal2.sandbox.types import Task


class BadConfig(ValueError):
    """A parameter set that is not in the family's space (unknown name or value)."""


@dataclass(frozen=True)
class Tiling:
    """How one config divides a GEMM among CTAs: each CTA owns a bm x bn output tile and walks K in bk-deep blocks;
    the K loop of every tile is cut into `splits` ranges on different CTAs (partials summed afterwards); with
    `stream_k` the scheduler also shares the last wave's K loops among all SMs, so the wave count is fractional;
    `cluster_reduce`: a tile's K ranges sum their partials through a cluster's shared memory, not the workspace;
    `serial_reduce`: they add their partials to the workspace one after another, each waiting for the one before;
    `last_arrival`: they leave their partials in the workspace and the last to arrive at the tile's ticket adds them,
    in the same launch (a cluster's CTAs first sum theirs through its shared memory); with `spread` as well, they all
    wait at the ticket for the last and each adds its 1/splits share of the tile (no one CTA reads every partial)."""

    bm: int
    bn: int
    bk: int
    splits: int = 1
    stream_k: bool = False
    cluster_reduce: bool = False
    serial_reduce: bool = False
    last_arrival: bool = False
    spread: bool = False


class KernelFamily(Protocol):
    name: str  # short and stable, e.g. "sm80_mma"; part of every config name
    archs: tuple[str, ...]  # compile targets it is written for, e.g. ("sm_80", "sm_90a")
    decomposition: tuple[str, ...]  # parameters that only change how work is cut over CTAs (see above)

    def space(self) -> dict[str, tuple[Any, ...]]: ...

    def default(self) -> Any: ...

    def make(self, params: dict[str, Any]) -> Any: ...

    def prune(self, cfg: Any, arch: str) -> str | None: ...

    def render(self, cfg: Any) -> str: ...

    def supports(self, cfg: Any, task: Task) -> str | None: ...

    def tiling(self, cfg: Any) -> Tiling: ...

    def like_cublaslt(self, lt: LtAlgo) -> list[Any]:
        """Configs of this family nearest to a cuBLASLt algorithm (tile, split-K, cluster), most faithful first; []
        when the family cannot express one (`tune --strategy cublaslt` starts from them)."""
        ...

    def settle(self, cfg: Any) -> Any:
        """`cfg` with the fields its kind of kernel does not use set to the one value prune() accepts there, so that
        a one-parameter change (`tune_search.one_step`) can reach such a kind from a parent that set them
        (sm90's `basic` takes no swizzle, raster order or stream-K; a pingpong winner with swizzle 4 has a basic
        twin). Identity where every field is always used."""
        ...

    def rerender_gain(self, cfg: Any) -> float:
        """How many times faster today's render of `cfg` may run than a render stored before the family's code
        changed: 1.0 where a change shaves at most a constant (`tune --strategy rerender` then takes the stale
        configs within RERENDER_WITHIN_US of a shape's fastest), more where it speeds up the whole kernel."""
        ...


# Field metadata of a parameter added to a family after results were stored: at its default it is left out of the
# config's name and of the rendered source's config lines, so that every stored config keeps its name and renders to
# the very source (hash) it was measured as; `make` fills it in when stored parameters lack it.
ADDED_LATER = {"added_later": True}


def shown_fields(cfg: Any) -> list:
    """The fields of `cfg` that its name and header show: all but ADDED_LATER ones at their default."""
    assert is_dataclass(cfg)
    return [f for f in fields(cfg)
            if not (f.metadata.get("added_later") and getattr(cfg, f.name) == f.default)]


def config_name(family: KernelFamily, cfg: Any) -> str:
    """`sm80_mma-BM128-BN128-BK32-...`: the family name and every shown field in declaration order."""
    parts = [f"{f.name}{_short(getattr(cfg, f.name))}" for f in shown_fields(cfg)]
    return "-".join([family.name, *parts])


def config_from_name(family: KernelFamily, name: str) -> Any:
    """The config whose `config_name` is `name` (the inverse, for names a researcher lists: `tune --strategy given`).
    Each `-`-separated part is a parameter name followed by its value as names print it; ADDED_LATER parameters a
    name leaves out take their defaults. Raises BadConfig naming what does not parse."""
    prefix, _, rest = name.partition("-")
    if prefix != family.name or not rest:
        raise BadConfig(f"{name!r} is not a {family.name} config name ({family.name}-<param><value>-...)")
    space = family.space()
    # Valid values per field: the searched space, and on/off for a flag kept out of the search (sm90's host_cache).
    values = {f.name: space.get(f.name, (False, True) if isinstance(f.default, bool) else ())
              for f in fields(family.default())}
    params: dict[str, Any] = {}
    for part in rest.split("-"):
        # The longest parameter name that prefixes the part and leaves one of its values (names such as "split_k"
        # and "splits" share a prefix).
        found = [(key, value) for key in sorted(values, key=len, reverse=True) if part.startswith(key)
                 for value in values[key] if _short(value) == part[len(key):]]
        if not found:
            raise BadConfig(f"{name!r}: {part!r} is no parameter of {family.name} with a value of its space")
        key, value = found[0]
        if key in params:
            raise BadConfig(f"{name!r}: {key} given twice")
        params[key] = value
    try:
        cfg = family.make(params)
    except BadConfig as e:
        raise BadConfig(f"{name!r}: {e}") from None
    if config_name(family, cfg) != name:  # e.g. parameters out of order, or an ADDED_LATER one at its default
        raise BadConfig(f"{name!r} is not as {family.name} names its configs: {config_name(family, cfg)!r}")
    return cfg


def config_params(cfg: Any) -> dict[str, Any]:
    return asdict(cfg)


def check_params(space: dict[str, tuple[Any, ...]], params: dict[str, Any]) -> None:
    """Raise BadConfig naming the first parameter that is unknown or outside `space` (shared by every family)."""
    for key, value in params.items():
        if key not in space:
            raise BadConfig(f"unknown parameter {key!r} (known: {', '.join(space)})")
        if value not in space[key]:
            raise BadConfig(f"{key}={value!r} is not one of {list(space[key])}")
    missing = [k for k in space if k not in params]
    if missing:
        raise BadConfig(f"missing parameter(s): {', '.join(missing)}")


def build_config(config_cls: type, space: dict[str, tuple[Any, ...]], params: dict[str, Any]) -> Any:
    """check_params, then the config with each value replaced by the space's own equal object, so that a str enum
    given by its value ("fp32", "cooperative") becomes the enum member (every family's `make`). ADDED_LATER
    parameters missing from `params` (stored before they existed) take their defaults."""
    later = {f.name: f.default for f in fields(config_cls) if f.metadata.get("added_later")}
    params = {**{k: v for k, v in later.items() if k not in params}, **params}
    check_params(space, params)
    return config_cls(**{key: next(v for v in space[key] if v == value) for key, value in params.items()})


def _short(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(getattr(value, "value", value))
