"""``python -m bench COMMAND``: see bench/commands.py (this shim is left out of mypy,
which would take it for a second ``__main__`` beside .ci/check-wheels)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from commands import main

sys.exit(main(sys.argv[1:]))
