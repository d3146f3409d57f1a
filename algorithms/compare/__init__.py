"""The comparison harness (installed as ``agentgym.algorithms.compare``): learners side by side.

:mod:`.harness` (``compare``: one trainer run per (arm, seed), same tasks and seeds, same budget),
:mod:`.arms` (the arms and their declared metrics), :mod:`.report` (CSV, table, plot, differences),
:mod:`.health` (per-arm health from the runs' diagnostics) and :mod:`.controls` (the negative control
``grpo-shuffled``, registered like any user learner). It may import :mod:`agentgym.algorithms.loop` and
:mod:`agentgym.algorithms.maths` (and :mod:`agentgym.algorithms.catalog`); neither imports it.
"""

from agentgym.algorithms.compare.arms import CompareError, Variant, parse_variants
from agentgym.algorithms.compare.controls import is_negative_control_learner
from agentgym.algorithms.compare.harness import compare, run_trl_grpo
from agentgym.algorithms.compare.report import markdown_table, summarize_runs, write_artifacts

__all__ = ["compare", "run_trl_grpo", "CompareError", "Variant", "parse_variants", "is_negative_control_learner",
           "markdown_table", "summarize_runs", "write_artifacts"]
