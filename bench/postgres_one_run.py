"""One taskmill-postgres enqueue-and-drain run per concurrency, as one JSON line: the
unit of a before/after comparison in alternated processes.

``postgres_prefetch_ab.py`` measures the code it imports; to compare two versions under
the same load, run this script alternately with each version first on ``PYTHONPATH``
(``git archive <commit> core/src backends/postgres/src | tar -x -C /tmp/before``), e.g.

    for i in 1 2 3; do
      PYTHONPATH=/tmp/before/core/src:/tmp/before/backends/postgres/src \\
        uv run python bench/postgres_one_run.py before
      uv run python bench/postgres_one_run.py after
    done >> bench/results/<name>.jsonl

Each line: the label, the ``taskmill`` module file (which version ran), the load
average, and per concurrency the processing and enqueue tasks/s of 20,000 no-op tasks
at ``prefetch=1000, finish_window=0.002``. See docs/benchmarks.md (issue 15).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent))

import postgres_prefetch_ab as ab
import taskmill


async def main(label: str) -> None:
    url = os.environ["TASKMILL_TEST_POSTGRES_URL"]
    out: dict[str, Any] = {
        "code": label,
        "taskmill_file": taskmill.__file__,
        "load": os.getloadavg()[0],
    }
    for concurrency in (10, 100):
        out[f"c{concurrency}"] = await ab.taskmill_run(url, 20_000, concurrency, 1000, 0.002)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "run"))
