"""Helpers for tests that race several real processes."""

from __future__ import annotations

import subprocess
import sys


def run_together(script: str, *args: str, processes: int) -> list[str]:
    """Start ``processes`` runs of ``script`` (which prints ``ready`` and waits for a
    line on stdin), release them at once, return the last line each printed."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    return [out.strip().splitlines()[-1] for out, _ in outputs]
