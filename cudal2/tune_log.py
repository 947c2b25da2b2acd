"""The tuner's own tables, kept in the result store's SQLite file next to its `sources` and `results` tables.

    tune_configs   source_hash -> (family, config name, params JSON): which generator config produced a source, so
                   every stored result of a generated kernel can be traced back to its config (and re-rendered)
    tune_compiles  (source_hash, arch, evaluator_version) -> compile outcome and ptxas figures. The evaluator stores
                   nothing for a compile-only evaluation (it says nothing about the kernel on a GPU), so this is what
                   a compile-only tuning run resumes from.

The ResultStore validates the file (and creates its schema) before this class touches it; these tables are created
if missing and never altered, so stores written before the tuner existed stay readable by both.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal2.kernels.family import KernelFamily, config_name, config_params
from cudal2.sandbox.store import BUSY_TIMEOUT_S, ResultStore
from cudal2.sandbox.types import EVALUATOR_VERSION, Mode, Status, Task, to_jsonable

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS tune_configs (
        source_hash TEXT PRIMARY KEY, family TEXT NOT NULL, config TEXT NOT NULL, params_json TEXT NOT NULL,
        first_seen REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS tune_compiles (
        source_hash TEXT NOT NULL, arch TEXT NOT NULL, evaluator_version TEXT NOT NULL, status TEXT NOT NULL,
        reason TEXT NOT NULL, registers INTEGER, spill_bytes INTEGER, seconds REAL, created REAL NOT NULL,
        PRIMARY KEY (source_hash, arch, evaluator_version))""",
)


@dataclass(frozen=True)
class ConfigRecord:
    """The generator config behind a stored source."""

    family: str
    name: str  # config_name(family, cfg)
    params: dict[str, Any]  # JSON values (enums as their values)

    @classmethod
    def of(cls, family: KernelFamily, cfg: Any) -> ConfigRecord:
        """The record of `cfg`, a config of `family`: what the log keeps for a source the family rendered from it."""
        return cls(family.name, config_name(family, cfg), to_jsonable(config_params(cfg)))


@dataclass(frozen=True)
class CompileRecord:
    """What compiling a source for one target gave. registers/spill_bytes: worst kernel in the library (None when it
    did not compile); seconds: nvcc wall time."""

    status: Status  # COMPILED, COMPILE_ERROR or STATIC_REJECT
    reason: str
    registers: int | None
    spill_bytes: int | None
    seconds: float


class TuneLog:
    """The tuner's tables in the store at `store.path`; its own connection (the store's is not shared)."""

    def __init__(self, store: ResultStore):
        self.path: Path = store.path
        self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        for statement in _SCHEMA:
            self._conn.execute(statement)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> TuneLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put_config(self, source_hash: str, record: ConfigRecord) -> None:
        """Record which config produced `source_hash` (first write wins: a source has one generator)."""
        self._conn.execute(
            "INSERT OR IGNORE INTO tune_configs (source_hash, family, config, params_json, first_seen)"
            " VALUES (?, ?, ?, ?, ?)",
            (source_hash, record.family, record.name, json.dumps(record.params, sort_keys=True), time.time()),
        )

    def config_of(self, source_hash: str) -> ConfigRecord | None:
        row = self._conn.execute(
            "SELECT family, config, params_json FROM tune_configs WHERE source_hash = ?", (source_hash,)
        ).fetchone()
        return ConfigRecord(row[0], row[1], json.loads(row[2])) if row else None

    def put_compile(self, source_hash: str, arch: str, record: CompileRecord) -> None:
        """Record (replacing) the compile outcome of `source_hash` for `arch` under this evaluator version."""
        self._conn.execute(
            "INSERT OR REPLACE INTO tune_compiles (source_hash, arch, evaluator_version, status, reason, registers,"
            " spill_bytes, seconds, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (source_hash, arch, EVALUATOR_VERSION, record.status.value, record.reason, record.registers,
             record.spill_bytes, record.seconds, time.time()),
        )

    def compile_of(self, source_hash: str, arch: str) -> CompileRecord | None:
        row = self._conn.execute(
            "SELECT status, reason, registers, spill_bytes, seconds FROM tune_compiles"
            " WHERE source_hash = ? AND arch = ? AND evaluator_version = ?",
            (source_hash, arch, EVALUATOR_VERSION),
        ).fetchone()
        return CompileRecord(Status(row[0]), row[1], row[2], row[3], row[4]) if row else None

    def carry_compiles(self, from_version: str, to_version: str, source_hashes: Iterable[str]) -> int:
        """Copy the compile records of these sources from `from_version` to `to_version` where it has none (see
        ResultStore.carry_forward); returns the records copied."""
        copied = 0
        self._conn.execute("BEGIN IMMEDIATE")  # all or nothing
        try:
            for h in source_hashes:
                copied += self._conn.execute(
                    "INSERT OR IGNORE INTO tune_compiles (source_hash, arch, evaluator_version, status, reason,"
                    " registers, spill_bytes, seconds, created) SELECT source_hash, arch, ?, status, reason,"
                    " registers, spill_bytes, seconds, created FROM tune_compiles"
                    " WHERE source_hash = ? AND evaluator_version = ?",
                    (to_version, h, from_version),
                ).rowcount
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        return copied

    def family_sources(self) -> list[tuple[str, ConfigRecord]]:
        """Every recorded config: (source hash, record), in hash order."""
        rows = self._conn.execute("SELECT source_hash, family, config, params_json FROM tune_configs ORDER BY 1")
        return [(h, ConfigRecord(family, name, json.loads(params))) for h, family, name, params in rows]

    def gpus_with_ok_results(self, task: Task, mode: Mode | str = Mode.OFFLINE) -> list[str]:
        """GPU labels that have an ok result on `task` (any source) under the current evaluator version."""
        rows = self._conn.execute(
            "SELECT DISTINCT gpu FROM results WHERE m = ? AND n = ? AND k = ? AND acc = ? AND evaluator_version = ?"
            " AND mode = ? AND status = ? ORDER BY gpu",
            (task.m, task.n, task.k, task.acc.value, EVALUATOR_VERSION, Mode(mode).value, Status.OK.value),
        ).fetchall()
        return [r[0] for r in rows]
