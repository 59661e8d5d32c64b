"""`python -m dlrm.perfmodel ...`: the deprecated alias of `python -m perfmodel ...`."""

import sys

from perfmodel.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
