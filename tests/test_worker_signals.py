"""Who receives SIGINT/SIGTERM when workers run in a plain asyncio program.

Real processes: each test runs a small program with ``asyncio.run()`` and signals it.
(Hosts that own their signals, uvicorn and Django, are covered by test_embedding.py.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TWO_WORKERS = textwrap.dedent(
    """
    import asyncio, sys
    from taskmill import Taskmill

    async def main() -> None:
        async with Taskmill(sys.argv[1], plugins=False) as tm:
            @tm.handler("nap")
            async def nap(ctx, params):
                await asyncio.sleep(params["seconds"])

            first = tm.worker(concurrency=2, reserved_high_priority_slots=0)
            second = tm.worker(concurrency=2, reserved_high_priority_slots=0)
            runs = [asyncio.create_task(w.run()) for w in (first, second)]
            await asyncio.sleep(0.3)
            print("ready", flush=True)
            await asyncio.gather(*runs)
            print("both stopped", first.stop_signal.name, second.stop_signal.name, flush=True)
        print("program finished", flush=True)

    asyncio.run(main())
    """
)


def _run_until_ready(code: str, *args: str, tmp_path: Path) -> subprocess.Popen[str]:
    script = tmp_path / "program.py"
    script.write_text(code)
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the program says it is ready
    assert line.strip() == "ready", (line, proc.stderr.read() if proc.stderr else "")
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_one_signal_stops_every_worker_of_a_plain_asyncio_program(
    sig: signal.Signals, tmp_path: Path
) -> None:
    proc = _run_until_ready(TWO_WORKERS, f"sqlite:///{tmp_path / 't.db'}", tmp_path=tmp_path)
    try:
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    assert f"both stopped {sig.name} {sig.name}" in out
    assert "program finished" in out
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_after_the_workers_stop_ctrl_c_is_the_programs_again(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import asyncio, sys
        from taskmill import Taskmill

        async def main() -> None:
            async with Taskmill(sys.argv[1], plugins=False) as tm:
                @tm.handler("nap")
                async def nap(ctx, params): ...

                await tm.worker().run_until_idle()
            print("ready", flush=True)
            await asyncio.sleep(60)

        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            print("KeyboardInterrupt reached the program", flush=True)
        """
    )
    proc = _run_until_ready(code, f"sqlite:///{tmp_path / 't.db'}", tmp_path=tmp_path)
    try:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "KeyboardInterrupt reached the program" in out
