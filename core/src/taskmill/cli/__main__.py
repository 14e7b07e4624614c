"""``python -m taskmill.cli``: the ``taskmill`` command line."""

import sys

from taskmill.cli import main

sys.exit(main())
