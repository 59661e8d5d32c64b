"""Is the stack installed in the Python running us? Asked by every package face before anything
imports it, so that `python -m dlrm.train` under an interpreter without torch (the system
Python, where `make venv` built .venv/) ends in one line naming the fix, not a traceback.

The same faces quiet torch.fx's "is_fx_tracing will return true for both ..." notice, which
torchrec's KeyedJaggedTensor trips on first use: it is not ours to fix, and it would be the first
line a user of the command line or of the library sees.

Asked with `importlib.util.find_spec`, which finds a module without importing it: parsing a
command line still does not pay for torch.
"""

from __future__ import annotations

import importlib.util
import logging
import sys

# what every package above this one imports (fbgemm is optional: a pure-PyTorch path stands in)
STACK = ("numpy", "torch", "torchrec")


class StackMissing(ModuleNotFoundError):
    """The stack is not installed in this interpreter."""


def require(package: str) -> None:
    """Return when the stack is importable; otherwise one line naming the fix: exit 2 while
    `python -m` is locating a command (argv[0] is '-m' then), a StackMissing for a library user."""
    from hybrid_dlrm.common import endings

    endings.while_starting()  # Ctrl-C while torch imports: one line, not a traceback
    missing = [m for m in STACK if importlib.util.find_spec(m) is None]
    if not missing:
        logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
        return
    message = (
        f"{package}: {', '.join(missing)} not installed for {sys.executable}: run `make venv` in "
        "the checkout, then use .venv/bin/python (or `source .venv/bin/activate` first)"
    )
    if sys.argv[:1] == ["-m"]:
        print(message, file=sys.stderr)
        raise SystemExit(2)
    raise StackMissing(message, name=missing[0])
