"""``agentgym/Math-v0``: generated math problems with exact answers, answer extraction and equivalence,
optional Python tool use, and reward-hacking detectors (see ``env.py``)."""

from agentgym.envs.mathrl.answers import answers_equal, extract_answer, parse_number
from agentgym.envs.mathrl.env import MathConfig, MathEnv
from agentgym.envs.mathrl.problems import KINDS, make_problem

__all__ = ["MathEnv", "MathConfig", "extract_answer", "parse_number", "answers_equal", "make_problem", "KINDS"]
