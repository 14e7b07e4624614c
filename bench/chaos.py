"""The chaos run (issue 16 §1): real worker processes killed while they work.

N tasks of mixed duration (some fail on their first attempts, some time out once) are
run by 3 ``python -m taskmill worker`` processes. Under chaos one of them, picked at
random, is ``kill -9``'d every few seconds and replaced, and the database server is
restarted ``--restarts`` times when the backend's restart variable holds the command
(``TASKMILL_TEST_POSTGRES_RESTART`` / ``TASKMILL_TEST_MYSQL_RESTART`` /
``TASKMILL_TEST_MONGO_RESTART``; never set by this script: the servers may be shared).
A clean round runs the same workload without kills or restarts, for the throughput
comparison.

Afterwards (:func:`check`):

- every task is terminal;
- no task was completed twice: at most one COMPLETED attempt each, no handler run began
  after the completed attempt, and every other attempt whose handler ran to its end is
  a LOST one (its process was killed before the outcome was written);
- the attempt log accounts for every attempt (numbers 1..attempts, the killed ones as
  LOST) and for every handler run the side channel recorded;
- ``progress_summary`` matches a recount of the tasks.

    uv run python bench/chaos.py --url sqlite:///chaos.db --tasks 5000

records both rounds in ``bench/results/chaos.jsonl``. ``tests/reliability/
test_chaos.py`` runs a reduced version in CI through :func:`run_round`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import attrs
from harness import Recorder, load_1min, now_iso, redact
from taskmill import Taskmill, TaskStatus
from taskmill.model import AttemptOutcome, Task

HERE = Path(__file__).resolve().parent
TERMINAL = {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}
RESTART_VARIABLES = {
    "postgresql": "TASKMILL_TEST_POSTGRES_RESTART",
    "postgres": "TASKMILL_TEST_POSTGRES_RESTART",
    "mysql": "TASKMILL_TEST_MYSQL_RESTART",
    "mongodb": "TASKMILL_TEST_MONGO_RESTART",
}
"""The variable holding each server backend's restart command (URL scheme → name)."""


def backend_of(url: str) -> str:
    """The backend name of ``url`` (its scheme)."""
    return url.split(":", 1)[0].lower()


def restart_command(url: str) -> str | None:
    """The restart command the environment gives for ``url``'s backend, if any."""
    variable = RESTART_VARIABLES.get(backend_of(url))
    return os.environ.get(variable) if variable else None


@attrs.frozen
class ChaosConfig:
    """The settings of one round."""

    url: str
    tasks: int = 500
    workers: int = 3
    concurrency: int = 8
    chaos: bool = True
    """Kill workers (and restart the server when a command is given); False: clean."""
    kill_interval: float = 3.0
    restarts: int = 3
    restart: str | None = None
    """The shell command that restarts the database server (None: no restarts)."""
    lease: float = 2.0
    seed: int = 16
    duration_scale: float = 1.0
    """Multiplies every handler's duration (a small CI run uses longer tasks, so that
    the kills land while tasks run)."""
    deadline: float = 600.0
    """Seconds the round may take before it is reported as stuck."""
    restarts_before_kills: bool = False
    """Restart the server first and start the kills after the last restart: a harness
    work-around for the stand-in nx-27017 only, which keeps the transaction of a killed
    client open on its one SQLite connection, so that every write made after it is lost
    by the next restart (MongoDB aborts such a transaction). docs/reliability.md."""
    kill_outside_writer_lock: bool = False
    """Kill only workers that do not hold taskmill-mongo's writer lock (so none inside
    a transaction): a harness work-around for the stand-in nx-27017 only, which keeps
    the writes of a killed client's unfinished transaction (MongoDB aborts it)."""
    expected_rate: float = 150.0
    """Tasks per second the round is expected to run at: the restarts are spread over
    the expected length of the run (a few on MongoDB's stand-in)."""


@attrs.define
class RoundResult:
    """What one round did and what the check found."""

    config: ChaosConfig
    seconds: float = 0.0
    kills: int = 0
    restarts: int = 0
    self_exits: int = 0
    spared: int = 0
    """Kills put off because the victim held the writer lock (kill_outside_writer_lock)."""
    """Workers that exited by themselves (a problem unless the server was restarted)."""
    statuses: dict[str, int] = attrs.field(factory=dict)
    attempts: int = 0
    lost_attempts: int = 0
    timed_out_attempts: int = 0
    failed_attempts: int = 0
    handler_runs: int = 0
    problems: list[str] = attrs.field(factory=list)

    @property
    def throughput(self) -> float:
        """Terminal tasks per second over the round."""
        return self.config.tasks / self.seconds if self.seconds else 0.0

    def as_json(self) -> dict[str, Any]:
        """The result as recorded in bench/results/."""
        config = attrs.asdict(self.config)
        config["url"] = backend_of(self.config.url)
        config["restart"] = bool(self.config.restart)
        return {
            "config": config,
            "seconds": round(self.seconds, 2),
            "tasks_per_second": round(self.throughput, 1),
            "kills": self.kills,
            "restarts": self.restarts,
            "self_exits": self.self_exits,
            "spared": self.spared,
            "statuses": self.statuses,
            "attempts": self.attempts,
            "lost_attempts": self.lost_attempts,
            "timed_out_attempts": self.timed_out_attempts,
            "failed_attempts": self.failed_attempts,
            "handler_runs": self.handler_runs,
            "lost_tasks": self.config.tasks
            - sum(n for s, n in self.statuses.items() if s in {t.value for t in TERMINAL}),
            "problems": self.problems,
        }


def workload(count: int, seed: int, scale: float = 1.0) -> list[dict[str, Any]]:
    """``count`` task specs of mixed duration, some failing, some timing out once."""
    rng = random.Random(seed)
    specs: list[dict[str, Any]] = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.03:
            specs.append({"task_type": "chaos/timeout", "params": {}, "max_retries": 3})
            continue
        duration = rng.choices([0, 10, 100, 800], weights=[45, 40, 12, 3])[0]
        ms = round(rng.randint(duration // 2, duration) * scale) if duration else 0
        fail = rng.choices([0, 1, 2, 99], weights=[83, 10, 5, 2])[0]
        specs.append(
            {
                "task_type": "chaos/work",
                "params": {"ms": ms, "fail_attempts": fail},
                "max_retries": 2,
            }
        )
    return specs


class Workers:
    """The worker processes of a round, started and killed by pid."""

    def __init__(self, config: ChaosConfig, log: Path, output: Path) -> None:
        self.config = config
        self.log = log
        self.output = output
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()

    def start(self) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "TASKMILL_CHAOS_LOG": str(self.log),
            "TASKMILL_DISABLE_PLUGINS": "demo,http,prometheus",
            "TASKMILL_RESCUE_INTERVAL": "0.5",
            "TASKMILL_RETRY_BASE": "0.05",
            "TASKMILL_MIN_POLL_INTERVAL": "0.01",
        }
        out = self.output.open("ab")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "taskmill",
                "worker",
                "--url",
                self.config.url,
                "--import",
                "chaos_handlers",
                "--concurrency",
                str(self.config.concurrency),
                "--reserved-high",
                "0",
                "--lease",
                str(self.config.lease),
                "--poll-interval",
                "0.2",
                "--shutdown-grace",
                "5",
                "--log-level",
                "warning",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    async def kill_one(self, rng: random.Random, tm: Taskmill) -> int | None:
        """``kill -9`` a random live worker; its pid (None: not this time).

        With ``kill_outside_writer_lock`` (the stand-in nx-27017 only) the victim is
        stopped first and spared if it holds the writer lock, that is if it may be inside
        a transaction: the stand-in keeps a killed client's half-done transaction."""
        victim = rng.choice(self.alive())
        if self.config.kill_outside_writer_lock:
            victim.send_signal(signal.SIGSTOP)
            try:
                spare = await _holds_writer_lock(tm, victim.pid)
            except Exception:
                spare = True  # cannot tell: try again shortly
            if spare:
                victim.send_signal(signal.SIGCONT)
                return None
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.killed.add(victim.pid)
        return victim.pid

    def stop(self) -> None:
        for proc in self.alive():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _holds_writer_lock(tm: Taskmill, pid: int) -> bool:
    """Whether process ``pid`` of this host holds taskmill-mongo's writer lock
    (``serialize_writes``), read directly, without taking the lock."""
    storage: Any = tm.storage
    lock = await storage._database().counters.find_one({"_id": "writer"})
    if lock is None or lock.get("owner") is None:
        return False
    return bool(lock.get("holder") == f"{socket.gethostname()}:{pid}")


async def _all_terminal(tm: Taskmill) -> bool:
    summary = await tm.progress_summary()
    return summary.pending == 0 and summary.running == 0


async def _all_tasks(tm: Taskmill) -> list[Task]:
    tasks: list[Task] = []
    after: str | None = None
    while True:
        page = await tm.query(limit=1000, after=after)
        if not page:
            return tasks
        tasks.extend(page)
        after = page[-1].id


async def run_round(config: ChaosConfig, workdir: Path) -> RoundResult:
    """Run one round on a fresh store at ``config.url`` and check it."""
    result = RoundResult(config)
    rng = random.Random(config.seed)
    log = workdir / f"runs-{os.getpid()}-{time.monotonic_ns()}.log"
    log.touch()
    workers = Workers(config, log, workdir / "workers.out")
    async with Taskmill(config.url, plugins=False) as tm:
        specs = workload(config.tasks, config.seed, config.duration_scale)
        for i in range(0, len(specs), 500):
            await tm.enqueue_many(specs[i : i + 500])
        began = time.monotonic()
        for _ in range(config.workers):
            workers.start()
        restart_every = None
        if config.chaos and config.restart and config.restarts:
            # Spread the restarts over the expected run (a quarter, a half, ...).
            restart_every = max(2.0, config.tasks / config.expected_rate / (config.restarts + 1))
        next_kill = began + config.kill_interval
        next_restart = began + restart_every if restart_every else None
        try:
            while True:
                try:
                    if await _all_terminal(tm):
                        break
                except Exception:  # the server is restarting: look again shortly
                    pass
                now = time.monotonic()
                if now - began > config.deadline:
                    result.problems.append(f"not every task terminal after {config.deadline} s")
                    break
                kills_held = (
                    config.restarts_before_kills
                    and next_restart is not None
                    and result.restarts < config.restarts
                )
                if config.chaos and now >= next_kill and not kills_held:
                    if await workers.kill_one(rng, tm) is None:
                        result.spared += 1
                    else:
                        result.kills += 1
                        workers.start()
                        next_kill = now + config.kill_interval * rng.uniform(0.5, 1.5)
                if (
                    next_restart is not None
                    and config.restart
                    and now >= next_restart
                    and result.restarts < config.restarts
                ):
                    await asyncio.to_thread(
                        subprocess.run, ["bash", "-c", config.restart], check=True, timeout=120
                    )
                    result.restarts += 1
                    assert restart_every is not None
                    next_restart = now + restart_every
                    if config.restarts_before_kills:
                        next_kill = time.monotonic() + config.kill_interval
                for proc in workers.procs:
                    if proc.poll() is not None and proc.pid not in workers.killed:
                        # A worker that cannot reach the server when it starts exits
                        # (its supervisor starts it again): expected around a restart.
                        result.self_exits += 1
                        if not result.restarts:
                            result.problems.append(f"worker {proc.pid} exited by itself")
                        workers.killed.add(proc.pid)
                        workers.start()
                await asyncio.sleep(0.1)
            result.seconds = time.monotonic() - began
        finally:
            workers.stop()
        await check(tm, result, log, workers.killed)
    return result


async def check(tm: Taskmill, result: RoundResult, log: Path, killed: set[int]) -> None:
    """Check the store against the side channel; append what is wrong to ``problems``."""
    runs: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for line in (await asyncio.to_thread(log.read_text)).splitlines():
        what, task_id, number, process = line.split()
        runs[task_id].append((what, int(number), int(process)))
    result.handler_runs = sum(1 for lines in runs.values() for k, _, _ in lines if k == "start")
    tasks = await _all_tasks(tm)
    problems = result.problems
    if len(tasks) != result.config.tasks:
        problems.append(f"{len(tasks)} tasks stored, {result.config.tasks} enqueued")
    counted = Counter(t.status.value for t in tasks)
    result.statuses = dict(sorted(counted.items()))
    summary = await tm.progress_summary()
    recount = {s.value: counted.get(s.value, 0) for s in TaskStatus}
    stored = {
        "pending": summary.pending,
        "running": summary.running,
        "completed": summary.completed,
        "failed": summary.failed,
        "cancelled": summary.cancelled,
    }
    if stored != recount or summary.total != len(tasks):
        problems.append(f"progress_summary {summary} != recount {recount}")
    for task in tasks:
        if task.status not in TERMINAL:
            problems.append(f"task {task.id} is {task.status.value}")
        attempts = await tm.attempts(task.id)
        result.attempts += len(attempts)
        outcomes = {a.number: a.outcome for a in attempts}
        result.lost_attempts += sum(o is AttemptOutcome.LOST for o in outcomes.values())
        result.timed_out_attempts += sum(o is AttemptOutcome.TIMED_OUT for o in outcomes.values())
        result.failed_attempts += sum(o is AttemptOutcome.FAILED for o in outcomes.values())
        if sorted(outcomes) != list(range(1, task.attempts + 1)) or len(attempts) != len(outcomes):
            problems.append(
                f"task {task.id}: attempt log {sorted(outcomes)} for {task.attempts} attempts"
            )
        completed = [n for n, o in outcomes.items() if o is AttemptOutcome.COMPLETED]
        if len(completed) > 1:
            problems.append(f"task {task.id} completed twice (attempts {completed})")
        if (task.status is TaskStatus.COMPLETED) != bool(completed):
            problems.append(f"task {task.id} is {task.status.value}, completed {completed}")
        for kind, attempt, pid in runs.get(task.id, []):
            if attempt not in outcomes:
                problems.append(f"task {task.id}: run of attempt {attempt} not in the log")
            elif completed and attempt > completed[0]:
                problems.append(f"task {task.id}: attempt {attempt} ran after completing")
            elif kind == "done" and outcomes[attempt] not in (
                AttemptOutcome.COMPLETED,
                AttemptOutcome.LOST,
            ):
                problems.append(
                    f"task {task.id}: attempt {attempt} completed its handler but is "
                    f"{outcomes[attempt].value}"
                )
            elif outcomes[attempt] is AttemptOutcome.LOST and pid not in killed:
                problems.append(f"task {task.id}: attempt {attempt} LOST by a live worker")
        if completed and not any(
            k == "done" and a == completed[0] for k, a, _ in runs.get(task.id, [])
        ):
            problems.append(f"task {task.id}: completed without its handler completing")


def main(argv: list[str] | None = None) -> int:
    """Run a clean round and a chaos round on ``--url`` and record both."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the store URL (its backend names the record)")
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--kill-interval", type=float, default=3.0)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument(
        "--stand-in",
        action="store_true",
        help="the server is MongoDB's stand-in nx-27017: restart it before the kills, "
        "and kill only workers outside a transaction (see docs/reliability.md)",
    )
    parser.add_argument(
        "--restarts-before-kills",
        action="store_true",
        help="restart the server first, kill workers only after the last restart (for "
        "the stand-in nx-27017, which loses every write made after a killed client's "
        "open transaction at its next restart; see docs/reliability.md)",
    )
    parser.add_argument(
        "--lease",
        type=float,
        default=2.0,
        help="the workers' lease in seconds (default 2); a store whose writes can take "
        "longer than a third of it lets leases of live workers expire (MongoDB's "
        "stand-in with serializeWrites under this load: use 10)",
    )
    parser.add_argument(
        "--expected-rate",
        type=float,
        default=150.0,
        help="tasks/s the chaos round is expected to run at; the restarts are spread "
        "over the expected run (default 150)",
    )
    parser.add_argument(
        "--store-per-round",
        default="{url}",
        help="the URL of each round, with {url} and {round} (default: --url; SQLite "
        "files and PostgreSQL schemas are best given per round)",
    )
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    restart = restart_command(args.url)
    recorder = Recorder("chaos", enabled=not args.no_record)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="taskmill-chaos-") as tmp:
        for number, chaos in enumerate([False, True]):
            url = args.store_per_round.format(url=args.url, round=number)
            config = ChaosConfig(
                url=url,
                tasks=args.tasks,
                workers=args.workers,
                concurrency=args.concurrency,
                chaos=chaos,
                kill_interval=args.kill_interval,
                restarts=args.restarts,
                restart=restart,
                seed=args.seed,
                lease=args.lease,
                restarts_before_kills=args.restarts_before_kills or args.stand_in,
                kill_outside_writer_lock=args.stand_in,
                deadline=3600,
                expected_rate=args.expected_rate,
            )
            load, date = load_1min(), now_iso()
            result = asyncio.run(run_round(config, Path(tmp)))
            entry = result.as_json()
            if chaos and rounds and rounds[0]["tasks_per_second"]:
                entry["chaos_vs_clean"] = round(
                    entry["tasks_per_second"] / rounds[0]["tasks_per_second"], 3
                )
            entry["load_after"] = load_1min()
            rounds.append(entry)
            print(json.dumps(entry, indent=1), flush=True)
            params = {
                "backend": backend_of(args.url),
                "url": redact(url),
                "server_restarts_exercised": bool(restart),
                **{k: v for k, v in vars(args).items() if k not in ("url", "no_record")},
            }
            recorder.record(
                "chaos" if chaos else "clean",
                entry,
                params=params,
                round=number,
                load=load,
                date=date,
            )
    recorder.done()
    return 1 if any(r["problems"] for r in rounds) else 0


if __name__ == "__main__":
    sys.exit(main())
