"""``python -m taskmill``: the ``taskmill`` command."""

import sys

from taskmill.cli import main

sys.exit(main())
