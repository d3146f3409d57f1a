"""What every benchmark script does the same way when it is run from a terminal.

``benchmarks/`` is not a package: a script in this folder imports this module directly (its folder is
``sys.path[0]``), one in a subfolder puts ``benchmarks/`` on the path first. Import it in the script's
``if __name__ == "__main__":`` block, so that tests which load a script as a module never touch
``sys.path``.

Default outputs belong under ``runs/`` (git-ignored): an ordinary run must not overwrite the results
committed under ``benchmarks/results/`` or ``benchmarks/search_r1/results/``; refreshing those is an
explicit ``--out``.
"""

from __future__ import annotations

import sys
from typing import Callable

__all__ = ["INTERRUPTED_EXIT", "NOTHING_KEPT", "run_interruptible"]

#: The shell's status for a process ended by SIGINT (128 + 2), so callers and scripts see "interrupted".
INTERRUPTED_EXIT = 130

#: What a script that writes its results only at the end has kept when it is interrupted.
NOTHING_KEPT = "nothing was written (results are written when the run ends); run it again to measure"


def run_interruptible(main: Callable[[], int | None], nothing_kept: str = NOTHING_KEPT) -> int:
    """``main()``'s exit status; on Ctrl-C one line on stderr instead of a traceback, and status 130.

    The line says what was kept and how to go on. A script that keeps partial work says so by raising
    ``KeyboardInterrupt("<what was kept; how to resume>")`` from its own handler; a bare Ctrl-C (no
    message) is reported with ``nothing_kept``. A second Ctrl-C while the first is being reported is
    not caught: the user asked twice.
    """
    try:
        status = main()
    except KeyboardInterrupt as e:
        message = str(e) or nothing_kept
        print(f"\ninterrupted: {message}", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    return 0 if status is None else int(status)
