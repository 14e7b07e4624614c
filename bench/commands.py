"""``python -m bench COMMAND``: the suite's commands (run from the repository root;
``bench/__main__.py`` calls :func:`main`).

- ``headline``: the headline set (bench/headline.py; ``--help`` for its options).
- ``throughput``: bench/throughput.py, the detailed tool (any backend and setting).

bench/ is a directory of scripts, not a package: this module puts it first on
``sys.path``, as running one of its scripts as a file does.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

COMMANDS = ("headline", "throughput")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        print(f"\nusage: python -m bench {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    command, rest = argv[0], argv[1:]
    sys.argv = [f"python -m bench {command}", *rest]  # for the commands' usage lines
    if command == "headline":
        import headline

        asyncio.run(headline.main(rest))
    else:
        import throughput

        asyncio.run(throughput.main(throughput.parse_args(rest)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
