"""``python -m minigraph demo|bench|grade|...``: the ``minigraph`` command, for a Python
whose scripts folder is not on the PATH (as ``python -m pip`` is to ``pip``)."""

import sys

from minigraph.cli import main

if __name__ == "__main__":
    sys.exit(main())
