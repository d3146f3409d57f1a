"""``agentgym/CodeExec-v0``: Python program synthesis graded by tests in a sandbox, with multi-turn
repair (see ``env.py``); the bundled problems and HumanEval/MBPP loaders are in ``problems.py``."""

from agentgym.envs.codeexec.env import CodeExecConfig, CodeExecEnv, format_report, run_tests, run_tests_batch
from agentgym.envs.codeexec.problems import (
    ProblemFormatError, bundled_problems, load_humaneval_jsonl, load_mbpp_jsonl, load_problems, split_of,
)

__all__ = ["CodeExecEnv", "CodeExecConfig",
           "run_tests", "run_tests_batch", "format_report", "bundled_problems", "load_problems",
           "load_humaneval_jsonl", "load_mbpp_jsonl", "ProblemFormatError", "split_of"]
