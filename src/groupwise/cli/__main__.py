"""``python -m groupwise.cli``: the same as the ``groupwise`` command."""

import sys

from groupwise.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
