"""Multi-turn BFCL: the live API instances of one episode, and the end-of-episode verdict.

Calls run through BFCL's own executor (``multi_turn_utils.execute_multi_turn_func_call``), so results read
exactly as they do in BFCL's inference loop, and the verdict is BFCL's ``multi_turn_checker`` (state and
response checks after every user turn). That executor ``eval``s call strings and keeps its instances in
its module globals under a model name: each episode and each verdict uses a fresh name, and its instances
are removed when done. A call reaches the executor only as ``method(key=<Python literal>, ...)`` built here
from parsed JSON, with ``method`` one of the public methods of the episode's API instances: a model's text
is never evaluated as code.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import keyword
import uuid
import weakref
from typing import Any, Mapping, Sequence

__all__ = ["MultiTurnSession", "call_string", "score_multi_turn", "ground_truth_calls", "MAX_INT", "MAX_DEPTH"]

#: the largest integer argument passed on: BFCL's classes compute with arguments directly
#: (``MathAPI.power(10, 10**9)`` would run for minutes); every ground-truth integer is below 10**6
MAX_INT = 10**6
#: the deepest nesting of lists and objects in an argument passed on: the executor ``eval``s the call, and
#: Python's parser takes at most 200 nested brackets (every ground-truth argument is at most 2 deep)
MAX_DEPTH = 100
#: tighter bounds on the arguments that set how much BFCL's MathAPI computes (``power(10, 10**6)``,
#: ``square_root(2, precision=10**6)`` run for minutes); the ground truth uses precision 10, and no power
_ARGUMENT_LIMITS = {("power", "exponent"): 1000, ("square_root", "precision"): 1000,
                    ("logarithm", "precision"): 1000}


def _utils() -> Any:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    return multi_turn_utils


def _long_context(category: str) -> bool:
    """BFCL loads the long-context scenario for these categories (its inference and checker alike)."""
    return "long_context" in category or "composite" in category


def _drop_instances(model_name: str) -> None:
    """Remove the executor's cached instances created under ``model_name`` (its names start with it)."""
    cache = vars(_utils())
    for key in [k for k in cache if k.startswith(model_name)]:
        del cache[key]


def _too_big(value: Any) -> bool:
    """Whether ``value`` holds an integer beyond ±MAX_INT (walked without recursion: nesting is checked apart)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, bool):
            continue
        if isinstance(v, int) and abs(v) > MAX_INT:
            return True
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests lists and objects more than MAX_DEPTH levels deep."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth >= MAX_DEPTH:
                return True
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def call_string(name: str, arguments: Mapping[str, Any]) -> str | None:
    """``name(key=literal, ...)``, BFCL's decoded multi-turn call, or None when ``name`` or a key is not a
    Python identifier. JSON values (``repr``) are Python literals, so the string holds no other code."""
    if not name.isidentifier() or keyword.iskeyword(name):
        return None
    if any(not isinstance(k, str) or not k.isidentifier() or keyword.iskeyword(k) for k in arguments):
        return None
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


class MultiTurnSession:
    """One episode's BFCL API instances (loaded with the task's initial config) and the calls made."""

    def __init__(self, task: Mapping[str, Any]):
        self.task = task
        self.model_name = f"agentgym_bfcl_{uuid.uuid4().hex}"
        self._release = weakref.finalize(self, _drop_instances, self.model_name)  # also when never closed
        _, self.instances = _utils().execute_multi_turn_func_call(
            [], task["initial_config"], task["involved_classes"], self.model_name, task["id"],
            long_context=_long_context(task["category"]))
        self.methods = {name for inst in self.instances.values()
                        for name, _ in inspect.getmembers(inst, predicate=inspect.ismethod) if not name.startswith("_")}

    def prepare(self, name: str, arguments: Mapping[str, Any]) -> tuple[str | None, str | None]:
        """``(call string, None)`` for a call the executor may run, else ``(None, error message)``."""
        if name not in self.methods:
            return None, f"Error: no function named {name!r} is available."
        text = call_string(name, arguments)
        if text is None:
            return None, f"Error: the argument names of {name!r} must be plain identifiers."
        if _too_deep(arguments):
            return None, f"Error: the arguments of {name!r} are nested too deeply (at most {MAX_DEPTH} levels)."
        if _too_big(arguments):
            return None, f"Error: integer arguments of {name!r} must lie within ±{MAX_INT}."
        for key, value in arguments.items():
            limit = _ARGUMENT_LIMITS.get((name, key))
            if limit is not None and isinstance(value, (int, float)) and not abs(value) <= limit:
                return None, f"Error: {key} of {name!r} must lie within ±{limit}, got {value!r}."
        return text, None

    def execute(self, calls: Sequence[str]) -> list[str]:
        """Run prepared call strings in order on the live instances; one result string each."""
        results, _ = _utils().execute_multi_turn_func_call(
            list(calls), self.task["initial_config"], self.task["involved_classes"], self.model_name,
            self.task["id"], long_context=_long_context(self.task["category"]))
        return [str(r) for r in results]

    def close(self) -> None:
        self._release()


def score_multi_turn(task: Mapping[str, Any], turns: Sequence[Sequence[Sequence[str]]]) -> dict[str, Any]:
    """BFCL's verdict on a finished episode: ``turns[t]`` holds, per step of user turn ``t``, the call strings
    of that step. Fewer turns than the task has (the episode was cut short) fails, as BFCL's runner does."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
    truth = task["ground_truth"]
    if len(turns) != len(truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"{len(turns)} of {len(truth)} user turns were completed"}
    model_name = f"agentgym_bfcl_{uuid.uuid4().hex}"
    entry = {"id": task["id"], "initial_config": task["initial_config"], "involved_classes": task["involved_classes"]}
    decoded = [[list(step) for step in turn if step] for turn in turns]
    try:
        result = multi_turn_checker(decoded, truth, entry, task["category"], model_name)
    except Exception as e:  # noqa: BLE001 - a model's calls must never crash the env
        result = {"valid": False, "error_type": "checker_error", "error_message": f"{type(e).__name__}: {e}"}
    finally:
        _drop_instances(model_name)
    return {"valid": bool(result.get("valid")), "error_type": str(result.get("error_type", "")),
            "error_message": str(result.get("error_message", ""))}


@functools.lru_cache(maxsize=None)
def _parameter_names(class_name: str) -> dict[str, tuple[str, ...]]:
    """Each method of a BFCL API class and its parameter names (``self`` left out)."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING
    cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
    return {name: tuple(p for p in inspect.signature(fn).parameters if p != "self")
            for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction)}


def ground_truth_calls(task: Mapping[str, Any]) -> list[list[dict[str, Any]]]:
    """The ground truth as ``{"name", "arguments"}`` calls per user turn (positional arguments named from the
    API method's signature), for the oracle."""
    methods: dict[str, tuple[str, ...]] = {}
    for cls_name in task["involved_classes"]:
        for name, params in _parameter_names(cls_name).items():
            methods.setdefault(name, params)
    out = []
    for turn in task["ground_truth"]:
        calls = []
        for text in turn:
            node = ast.parse(text, mode="eval").body
            assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name), text
            params = methods[node.func.id]
            args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
            args.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})
            calls.append({"name": node.func.id, "arguments": args})
        out.append(calls)
    return out
