"""The benchmark harness every script in bench/ records through.

- :func:`machine`: the machine a figure depends on (CPU model, cores, memory, Python,
  SQLite library, OS); :func:`git_state`: the commit and whether tracked files had
  uncommitted changes; :func:`load_1min`: the 1-minute load average, taken at the start
  of every measurement.
- :class:`Recorder`: one invocation of one script. Every record it writes is one JSON
  object on one line of ``bench/results/<series>.jsonl`` (appended, never rewritten), in
  the schema described in bench/README.md ("Records").
- :func:`alternate`: rounds of measurements, each round running every measurement once
  in the order given (the references first), so that a ratio compares figures taken
  under the same load; every measurement is recorded as it ends.
- URL helpers (:func:`redact`, :func:`with_query`, :func:`plain_dsn`) and
  :class:`PostgresSchemas`, which creates the schemas of one invocation's runs and drops
  only those.

Scripts are run as files (``uv run python bench/throughput.py``: bench/ is first on
``sys.path``, so they import this module as ``harness``); ``uv run python -m bench
headline`` runs bench/__main__.py, which puts bench/ first on ``sys.path`` too.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import secrets
import shlex
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
SCHEMA_VERSION = 1
"""The version of the record schema (bench/README.md, "Records")."""

THROUGHPUT_PREFETCH = 1000
THROUGHPUT_FINISH_WINDOW = 0.002
"""The best setting for throughput: ``prefetch=1000, finish_window=0.002``."""


# -- the machine and the code ---------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _ram_gib() -> float | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """What the figures depend on besides the code and the load."""
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "ram_gib": _ram_gib(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sqlite_library": sqlite3.sqlite_version,
        "os": platform.platform(),
    }


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state() -> dict[str, Any]:
    """``{"commit": ..., "dirty": ...}``: the checked-out commit, and whether tracked
    files differ from it (untracked files do not count); None where git cannot tell."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def load_1min() -> float:
    """The 1-minute load average: other work on the machine shows in every figure."""
    return round(os.getloadavg()[0], 2)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- URLs -----------------------------------------------------------------------------


def redact(url: str) -> str:
    """The URL without its password, fit for a record."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username}:***@{host}" if parts.username else host
    return urlunsplit(parts._replace(netloc=netloc))


def with_query(url: str, **params: str) -> str:
    """``url`` with these query parameters set (the others kept)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update(params)
    return urlunsplit(parts._replace(query=urlencode(query)))


def plain_dsn(url: str) -> str:
    """A ``postgresql://`` URL as asyncpg takes it: no taskmill query options."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme="postgresql", query=""))


def backend_of(url: str) -> str:
    """The backend a URL names: ``memory``, ``sqlite``, ``postgresql``, ``mysql``, ..."""
    scheme = urlsplit(url).scheme.lower()
    if scheme.startswith("postgres"):
        return "postgresql"
    if scheme.startswith("mongodb"):
        return "mongodb"
    if scheme.startswith(("mysql", "mariadb")):
        return "mysql"
    return scheme or "unknown"


def is_postgres(url: str) -> bool:
    return backend_of(url) == "postgresql"


def fresh_name(prefix: str) -> str:
    """A name for a schema or database of one run: ``<prefix>_<8 hex digits>``."""
    return f"{prefix}_{secrets.token_hex(4)}"


class PostgresSchemas:
    """The PostgreSQL schemas one invocation creates: :meth:`url` names a fresh one (the
    store creates it when it opens), :meth:`drop` drops one of them; a schema this
    object did not name is never dropped."""

    def __init__(self, url: str, prefix: str = "bench") -> None:
        self.base = url
        self.prefix = prefix
        self.created: set[str] = set()

    def url(self) -> tuple[str, str]:
        """(a URL naming a fresh schema, the schema's name)."""
        schema = fresh_name(self.prefix)
        self.created.add(schema)
        return with_query(self.base, schema=schema), schema

    async def drop(self, schema: str) -> None:
        if schema not in self.created:
            raise ValueError(f"schema {schema!r} was not created by this run: not dropped")
        import asyncpg

        connection = await asyncpg.connect(plain_dsn(self.base))
        try:
            await connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await connection.close()
        self.created.discard(schema)


# -- records --------------------------------------------------------------------------


class Recorder:
    """One invocation of one script, recording into ``<results_dir>/<series>.jsonl``.

    Every record carries the invocation's id (``run``), the commit and dirty flag and the
    machine, taken once at the start, and its own date and 1-minute load, taken at the
    start of the measurement it records. ``enabled=False`` (``--no-record``) builds the
    records without writing them.
    """

    def __init__(
        self,
        series: str,
        *,
        results_dir: Path = RESULTS_DIR,
        enabled: bool = True,
        argv: list[str] | None = None,
    ) -> None:
        self.series = series
        self.results_dir = results_dir
        self.enabled = enabled
        self.run = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)
        self.git = git_state()
        self.machine = machine()
        words = [redact(word) if "://" in word else word for word in (argv or sys.argv)]
        if words:
            words[0] = os.path.relpath(words[0], REPO_DIR) if os.path.isabs(words[0]) else words[0]
        self.command = shlex.join(words)
        self.written = 0

    @property
    def path(self) -> Path:
        return self.results_dir / f"{self.series}.jsonl"

    def record(
        self,
        name: str,
        figures: dict[str, Any],
        *,
        params: dict[str, Any] | None = None,
        round: int | None = None,
        load: float | None = None,
        date: str | None = None,
    ) -> dict[str, Any]:
        """Build one record (and append it, unless disabled); returns it. ``load`` and
        ``date`` default to now: pass the values taken at the measurement's start."""
        record: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "series": self.series,
            "run": self.run,
            "date": date or now_iso(),
            "commit": self.git["commit"],
            "dirty": self.git["dirty"],
            "machine": self.machine,
            "load_1min": load_1min() if load is None else load,
            "command": self.command,
            "name": name,
            "round": round,
            "params": params or {},
            "figures": figures,
        }
        if self.enabled:
            self.results_dir.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as out:
                out.write(json.dumps(record, sort_keys=False, default=str) + "\n")
            self.written += 1
        return record

    def done(self) -> None:
        """Say where the records went."""
        if self.enabled and self.written:
            shown = (
                self.path.relative_to(REPO_DIR) if self.path.is_relative_to(REPO_DIR) else self.path
            )
            print(f"recorded {self.written} record(s) in {shown} (run {self.run})")


def read_series(series: str, results_dir: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """Every record of a series, oldest first."""
    path = results_dir / f"{series}.jsonl"
    if not path.exists():
        return []
    with path.open() as lines:
        return [json.loads(line) for line in lines if line.strip()]


# -- rounds ---------------------------------------------------------------------------


class Skip(Exception):
    """A measurement that cannot run here (say why); recorded as skipped, not failed."""


@dataclass
class Measurement:
    """One thing measured once per round: ``run`` returns its figures."""

    name: str
    run: Callable[[], Awaitable[dict[str, Any]]]
    params: dict[str, Any] = field(default_factory=dict)


async def measure_once(
    recorder: Recorder, measurement: Measurement, round: int | None = None
) -> dict[str, Any]:
    """Run one measurement from a collected heap, recording the load and the date at its
    start; returns its record (with ``"skipped": reason`` in its figures if it raised
    :class:`Skip`)."""
    gc.collect()
    load = load_1min()
    date = now_iso()
    try:
        figures = await measurement.run()
    except Skip as skipped:
        figures = {"skipped": str(skipped)}
    return recorder.record(
        measurement.name, figures, params=measurement.params, round=round, load=load, date=date
    )


async def alternate(
    recorder: Recorder,
    rounds: int,
    measurements: list[Measurement],
    *,
    show: Callable[[dict[str, Any]], str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` rounds, each running every measurement once in the order given; returns
    each measurement's records (by name), round by round."""
    out: dict[str, list[dict[str, Any]]] = {m.name: [] for m in measurements}
    for number in range(1, rounds + 1):
        for measurement in measurements:
            record = await measure_once(recorder, measurement, number)
            out[measurement.name].append(record)
            text = show(record) if show else describe(record["figures"])
            print(
                f"round {number}/{rounds}  {measurement.name:<34} {text}  "
                f"load {record['load_1min']:.2f}",
                flush=True,
            )
    return out


def describe(figures: dict[str, Any]) -> str:
    """A measurement's figures on one line."""
    if "skipped" in figures:
        return f"skipped: {figures['skipped']}"
    parts = []
    for key, value in figures.items():
        if isinstance(value, float):
            parts.append(f"{key} {value:,.0f}" if value >= 100 else f"{key} {value:.3g}")
        elif isinstance(value, int | str):
            parts.append(f"{key} {value}")
    return ", ".join(parts)


def median_of(records: Iterable[dict[str, Any]], key: str) -> float | None:
    """The median of ``figures[key]`` over the records that have it (None: none have)."""
    values = [r["figures"][key] for r in records if isinstance(r["figures"].get(key), int | float)]
    return statistics.median(values) if values else None


def ratios(
    records: list[dict[str, Any]], references: list[dict[str, Any]], key: str = "process_per_s"
) -> list[float]:
    """Per round, ``records``' figure over ``references``' figure of the same round."""
    by_round = {r["round"]: r["figures"].get(key) for r in references}
    out = []
    for record in records:
        value, reference = record["figures"].get(key), by_round.get(record["round"])
        if isinstance(value, int | float) and isinstance(reference, int | float) and reference:
            out.append(value / reference)
    return out


def wait_for_quiet(threshold: float, max_wait: float, poll: float = 15.0) -> float:
    """Wait up to ``max_wait`` seconds for the 1-minute load to drop to ``threshold``;
    returns the load then (the caller runs anyway)."""
    deadline = time.monotonic() + max_wait
    load = load_1min()
    if load > threshold:
        print(f"load {load:.2f} > {threshold}: waiting up to {max_wait:.0f} s", flush=True)
    while load > threshold and time.monotonic() < deadline:
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        load = load_1min()
    return load
