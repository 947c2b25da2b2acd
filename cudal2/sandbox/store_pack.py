"""A result store kept in git as one gzipped base file plus small gzipped deltas.

Why: the H200 grid store is 264 MB of SQLite (37 MB gzipped), and one device call adds a few hundred to a few
thousand result rows (1-2 MB of SQLite, a few hundred KB gzipped). Committing the whole grown file after each call
put another 37 MB into the history every time; the thirty-fifth session did it eight times and its submission was
refused for size (a submission carries at most 256 MiB of diffs). Deltas keep a call's commit as small as what the
call measured, and the history grows by that much, not by the whole store.

The committed form of a store `NAME.sqlite.gz`:

    NAME.sqlite.gz              the base: a whole result store, gzipped (never rewritten)
    NAME.deltas/0001.sqlite.gz  a result store holding only the rows one device call added, with their row ids
    NAME.deltas/0002.sqlite.gz  ...

    assemble(committed, out)       base, then every delta in order -> one plain SQLite store at `out`
    write_delta(grown, committed)  the rows of `grown` that the assembled committed store lacks -> the next delta

Rows keep their ids, because the store's readers take the newest row of a key by its id (`MAX(id)`): a delta holds
result ids that continue the committed store's without a gap, and a result row that both hold must be the same row
(same source and creation time), else the grown store did not start from this committed store and nothing is written.
Sources are keyed by their hash (first write wins, as in the store); the cuBLASLt algorithm cache by its key, a newer
entry replacing the older one. The tuner's bookkeeping in the same file (cudal2.tune_log: which config made each
source, its compile outcomes) travels too, keyed by its primary keys, a newer row replacing the older one: without
it the new sources could be neither named by `cudal2 report` nor bred from by `cudal2 tune`.

`grown` may be a whole store (what a device call leaves) or a delta the device sent back (only the new rows): the
same rules take from either exactly what the committed store lacks, so a delta made against an older commit still
adds only its new rows.
"""

from __future__ import annotations

import gzip
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

from cudal2.sandbox.store import ResultStore, StoreError

DELTA_DIGITS = 4  # 0001.sqlite.gz .. 9999.sqlite.gz: sorted by name is applied in order
DELTA_SUFFIX = ".sqlite.gz"
TABLES = ("results", "sources", "algo_cache")  # in the order of Rows' fields
# The tuner's tables (cudal2.tune_log), where a store has them: copied with their schema, rows by primary key.
TUNE_TABLES = ("tune_configs", "tune_compiles")


def deltas_dir(committed: Path) -> Path:
    """Where the deltas of the committed store `committed` live: NAME.sqlite.gz -> NAME.deltas beside it."""
    name = committed.name.removesuffix(".gz").removesuffix(".sqlite")
    return committed.with_name(f"{name}.deltas")


def delta_files(committed: Path) -> list[Path]:
    """The deltas of `committed`, in the order they are applied (an absent folder: none)."""
    folder = deltas_dir(committed)
    pattern = "[0-9]" * DELTA_DIGITS + DELTA_SUFFIX
    return sorted(folder.glob(pattern)) if folder.is_dir() else []


@dataclass(frozen=True)
class Rows:
    """Row counts per table (results, sources, cuBLASLt algorithm cache entries)."""

    results: int
    sources: int
    algos: int

    def render(self) -> str:
        return f"{self.results} results, {self.sources} sources, {self.algos} cuBLASLt algorithms"


@dataclass(frozen=True)
class Assembled:
    """What `assemble` wrote: the plain store at `path`, from the base, `deltas` delta files and `apart` stores kept
    apart from them."""

    path: Path
    deltas: int
    rows: Rows
    apart: int = 0


@dataclass(frozen=True)
class Delta:
    """What `write_delta` found: `rows` new rows, result ids `first_id`..`last_id` (None when no result is new), and
    the file it wrote (None when nothing was new: no file is written then)."""

    rows: Rows
    first_id: int | None
    last_id: int | None
    path: Path | None

    def render(self) -> str:
        if self.path is None:
            return "nothing new: the grown store holds no row the committed store lacks; no delta written"
        ids = f" (result ids {self.first_id}..{self.last_id})" if self.first_id is not None else ""
        return f"{self.path}: {self.rows.render()}{ids}, {self.path.stat().st_size / 1024:.0f} KiB gzipped"


def _copy_plain(src: Path, dst: Path) -> None:
    """`src` copied to `dst` as a plain SQLite file: gunzipped when its name ends in .gz, else through SQLite's backup,
    which also takes the rows still in a live store's write-ahead log (a byte copy of the main file would lose them)."""
    if not src.is_file():
        raise StoreError(f"{src}: no such store")
    try:
        if src.suffix == ".gz":
            with gzip.open(src, "rb") as f, open(dst, "wb") as out:
                shutil.copyfileobj(f, out)
            return
        with closing(sqlite3.connect(f"file:{src}?mode=ro", uri=True)) as source, closing(sqlite3.connect(dst)) as out:
            source.backup(out)
    except (OSError, EOFError, sqlite3.DatabaseError) as e:  # gzip.BadGzipFile is an OSError
        raise StoreError(f"{src}: cannot read as a cudal2 result store: {e}") from None


def _check_store(path: Path, shown: Path) -> None:
    """Raise StoreError (naming `shown`) unless `path` opens as a cudal2 result store; sets its tables up."""
    try:
        ResultStore(path).close()
    except StoreError as e:
        raise StoreError(str(e).replace(str(path), str(shown), 1)) from None


def _columns(conn: sqlite3.Connection, table: str) -> str:
    return ", ".join(row[1] for row in conn.execute(f"PRAGMA main.table_info({table})"))


def _count(conn: sqlite3.Connection, schema: str) -> Rows:
    return Rows(*(conn.execute(f"SELECT COUNT(*) FROM {schema}.{t}").fetchone()[0] for t in TABLES))


@contextmanager
def _attached(conn: sqlite3.Connection, path: Path, schema: str) -> Iterator[None]:
    conn.execute(f"ATTACH DATABASE ? AS {schema}", (str(path),))
    try:
        yield
    finally:
        conn.execute(f"DETACH DATABASE {schema}")


def _table_sql(conn: sqlite3.Connection, schema: str, table: str) -> str | None:
    row = conn.execute(f"SELECT sql FROM {schema}.sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
    return row[0] if row else None


def _copy_tune_tables(conn: sqlite3.Connection, src: str, skip: str | None) -> None:
    """The rows of the tuner's tables in the attached store `src` that the attached store `skip` (None: none) lacks,
    into the main store (each table created there, as in `src`, where missing); a row with the same primary key is
    replaced."""
    for table in TUNE_TABLES:
        sql = _table_sql(conn, src, table)
        if sql is None:
            continue
        if _table_sql(conn, "main", table) is None:
            conn.execute(sql)
        cols = _columns(conn, table)
        rows = f"SELECT {cols} FROM {src}.{table}"
        if skip is not None and _table_sql(conn, skip, table) is not None:
            rows += f" EXCEPT SELECT {cols} FROM {skip}.{table}"
        conn.execute(f"INSERT OR REPLACE INTO main.{table} ({cols}) {rows}")


def _max_id(conn: sqlite3.Connection, schema: str) -> int:
    return conn.execute(f"SELECT COALESCE(MAX(id), 0) FROM {schema}.results").fetchone()[0]


def _apply(conn: sqlite3.Connection, schema: str, shown: Path) -> None:
    """Add the rows of the attached delta `schema` to the main store, in one transaction."""
    first = conn.execute(f"SELECT MIN(id) FROM {schema}.results").fetchone()[0]
    top = _max_id(conn, "main")
    if first is not None and first != top + 1:
        raise StoreError(f"{shown}: its results start at id {first}, but the store before it ends at id {top}: "
                         "deltas must continue the ids without a gap or overlap (was one removed or reordered?)")
    with conn:  # one transaction (sqlite3 opens it before the first INSERT; `with` commits or rolls back)
        for table, verb in (("sources", "INSERT OR IGNORE"), ("results", "INSERT"), ("algo_cache", "INSERT OR REPLACE")):
            cols = _columns(conn, table)
            conn.execute(f"{verb} INTO main.{table} ({cols}) SELECT {cols} FROM {schema}.{table}")
        _copy_tune_tables(conn, schema, None)


def _apply_apart(conn: sqlite3.Connection, schema: str, shown: Path) -> None:
    """Add the rows of the attached store `schema`, kept apart from the committed store's history (another GPU's rows,
    as benchmarks/stores/h100_*.sqlite.gz), to the main store in one transaction: its results take the next ids in
    their own order, since their ids may overlap deltas committed after them. A result row the main store already
    holds (same source, shape, GPU, mode and creation time) means the file was committed as a delta too: refused."""
    key = "source_hash, m, n, k, acc, gpu, evaluator_version, mode, created"
    again = conn.execute(f"SELECT COUNT(*) FROM (SELECT {key} FROM {schema}.results INTERSECT "
                         f"SELECT {key} FROM main.results)").fetchone()[0]
    if again:
        raise StoreError(f"{shown}: {again} of its results are already in the store (is it one of its deltas?)")
    cols = ", ".join(c for c in _columns(conn, "results").split(", ") if c != "id")
    with conn:
        conn.execute(f"INSERT OR IGNORE INTO main.sources SELECT * FROM {schema}.sources")
        conn.execute(f"INSERT INTO main.results ({cols}) SELECT {cols} FROM {schema}.results ORDER BY id")
        algo = _columns(conn, "algo_cache")
        conn.execute(f"INSERT OR REPLACE INTO main.algo_cache ({algo}) SELECT {algo} FROM {schema}.algo_cache")
        _copy_tune_tables(conn, schema, None)


def _attach_each(conn: sqlite3.Connection, files: Sequence[Path], tmp: Path,
                 apply: Callable[[sqlite3.Connection, str, Path], None]) -> None:
    """`apply(conn, "d", file)` for each store file in turn, attached as a plain copy (checked to be a result store)."""
    for file in files:
        plain = tmp / "delta.sqlite"
        _copy_plain(file, plain)
        _check_store(plain, file)
        with _attached(conn, plain, "d"):
            apply(conn, "d", file)
        plain.unlink()


def assemble(committed: Path, out: Path, apart: Sequence[Path] = ()) -> Assembled:
    """The committed store `committed` (base NAME.sqlite.gz and its deltas) as one plain SQLite store at `out`, then
    the rows of each store in `apart` (kept apart from that history: another GPU's rows) after them.

    `out` must not exist: an existing file is never overwritten. Raises StoreError (one line) on a base or delta that
    is not a result store or does not continue the ids before it; `out` is removed then."""
    if out.exists():
        raise StoreError(f"{out}: already exists (assemble writes a new file and never overwrites one)")
    deltas = delta_files(committed)
    try:
        _copy_plain(committed, out)
        _check_store(out, committed)
        with tempfile.TemporaryDirectory() as tmp, closing(sqlite3.connect(out)) as conn:
            _attach_each(conn, deltas, Path(tmp), _apply)
            _attach_each(conn, apart, Path(tmp), _apply_apart)
            rows = _count(conn, "main")
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return Assembled(out, len(deltas), rows, len(apart))


def _check_same_history(conn: sqlite3.Connection, grown: Path, top: int) -> None:
    """Every result row that the grown store (`g`) and the committed one (`c`) both hold, up to id `top`, must be the
    same row; otherwise the grown store did not start from the committed one and its new ids mean something else."""
    differ = conn.execute(
        "SELECT g.id FROM g.results g JOIN c.results c ON c.id = g.id"
        " WHERE g.id <= ? AND (g.source_hash != c.source_hash OR g.created != c.created) LIMIT 1",
        (top,),
    ).fetchone()
    if differ is not None:
        raise StoreError(f"{grown}: result id {differ[0]} differs from the committed store's: it did not start from "
                         "this committed store (assemble the committed store, run on that, then take the delta)")
    first_new = conn.execute("SELECT MIN(id) FROM g.results WHERE id > ?", (top,)).fetchone()[0]
    if first_new is not None and first_new != top + 1:
        raise StoreError(f"{grown}: its new results start at id {first_new}, but the committed store ends at id {top}: "
                         f"rows {top + 1}..{first_new - 1} are missing (add the earlier delta first)")


def _next_delta_path(committed: Path) -> Path:
    existing = delta_files(committed)
    number = int(existing[-1].name[:DELTA_DIGITS]) + 1 if existing else 1
    if number >= 10**DELTA_DIGITS:
        raise StoreError(f"{deltas_dir(committed)}: {10**DELTA_DIGITS - 1} deltas already; fold them into a new base")
    return deltas_dir(committed) / f"{number:0{DELTA_DIGITS}d}{DELTA_SUFFIX}"


def _write_gzip(src: Path, dst: Path) -> None:
    """`src` gzipped to `dst`, byte for byte the same for the same input (no timestamp in the header)."""
    tmp = dst.with_name(dst.name + ".part")
    with open(src, "rb") as f, open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as z:
        shutil.copyfileobj(f, z)
    tmp.replace(dst)  # a whole file or none: an interrupted write leaves no half delta to be applied


def write_delta(grown: Path, committed: Path, out: Path | None = None) -> Delta:
    """Write the rows of `grown` (a plain or gzipped store: a device call's whole store, or a delta it sent back)
    that the committed store `committed` lacks, as a gzipped delta store: at `out`, or (None) as the next numbered
    delta of `committed`. Writes nothing when no row is new. Raises StoreError (one line) when `grown` is not a
    result store or did not start from `committed` (see `_check_same_history`)."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base = assemble(committed, tmp / "committed.sqlite").path
        plain_grown = tmp / "grown.sqlite"
        _copy_plain(grown, plain_grown)
        _check_store(plain_grown, grown)
        delta = tmp / "delta.sqlite"
        ResultStore(delta).close()  # an empty store: the schema, its version row and indexes
        with closing(sqlite3.connect(delta)) as conn:
            with _attached(conn, plain_grown, "g"), _attached(conn, base, "c"):
                top = _max_id(conn, "c")
                _check_same_history(conn, grown, top)
                with conn:
                    cols = _columns(conn, "results")
                    conn.execute(f"INSERT INTO results ({cols}) SELECT {cols} FROM g.results WHERE id > ?", (top,))
                    cols = _columns(conn, "sources")
                    conn.execute(f"INSERT INTO sources ({cols}) SELECT {cols} FROM g.sources"
                                 " WHERE source_hash NOT IN (SELECT source_hash FROM c.sources)")
                    cols = _columns(conn, "algo_cache")
                    conn.execute(f"INSERT INTO algo_cache ({cols}) SELECT {cols} FROM g.algo_cache"
                                 f" EXCEPT SELECT {cols} FROM c.algo_cache")
                    _copy_tune_tables(conn, "g", "c")
            rows = _count(conn, "main")
            tune_rows = sum(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                            for t in TUNE_TABLES if _table_sql(conn, "main", t) is not None)
            first, last = conn.execute("SELECT MIN(id), MAX(id) FROM results").fetchone()
            conn.execute("PRAGMA journal_mode = DELETE")  # one self-contained file, no -wal beside it
        if rows == Rows(0, 0, 0) and tune_rows == 0:
            return Delta(rows, None, None, None)
        target = out if out is not None else _next_delta_path(committed)
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_gzip(delta, target)
    return Delta(rows, first, last, target)


def materialise(path: Path, tmp: Path) -> Path:
    """A plain store to read for `path`: `path` itself, or (a committed NAME.sqlite.gz) its base and deltas assembled
    in the folder `tmp`."""
    if path.suffix != ".gz":
        return path
    return assemble(path, tmp / path.name.removesuffix(".gz")).path
