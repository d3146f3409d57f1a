"""Single-turn scoring by BFCL's own rules: its AST checker, run on our parsed calls.

``bfcl_eval.eval_checker.ast_eval.ast_checker`` imports ``bfcl_eval.constants.model_config`` only to look
up one flag of the model being scored (``underscore_to_dot``: whether the model saw ``.`` in function
names replaced by ``_``), and that module imports every provider SDK BFCL supports (and tree-sitter). So
the checker's source is compiled here, unchanged except for that one import, into a private module whose
``MODEL_CONFIG_MAPPING`` answers the flag for agentgym's two settings. Nothing in ``sys.modules`` is
touched, and if BFCL changes the import line the load fails loudly instead of scoring differently.

Relevance categories follow ``bfcl_eval.eval_checker.eval_runner._evaluate_single_relevance_entry``:
``irrelevance`` and ``live_irrelevance`` succeed when no call is made, ``live_relevance`` when one is.
"""

from __future__ import annotations

import importlib.util
import threading
import types
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .data import is_relevance

__all__ = ["MODEL_NAME", "MODEL_NAME_UNDERSCORE", "ast_checker_module", "decoded", "score_single_turn",
           "language_of"]

#: the model names agentgym passes to BFCL's checker: dots kept in function names, or replaced by "_"
MODEL_NAME = "agentgym-dots"
MODEL_NAME_UNDERSCORE = "agentgym-underscores"
_CHECKER = "bfcl_eval.eval_checker.ast_eval.ast_checker"
_IMPORT_LINE = "from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING\n"
_LOCK = threading.Lock()
_MODULE: types.ModuleType | None = None


@dataclass(frozen=True)
class _ModelFlags:
    underscore_to_dot: bool


class _AgentgymModels(dict):
    """BFCL's ``MODEL_CONFIG_MAPPING`` for agentgym's two names (the checker escapes ``_`` to ``/`` first)."""

    def __init__(self):
        super().__init__({MODEL_NAME: _ModelFlags(False), MODEL_NAME_UNDERSCORE: _ModelFlags(True)})


def ast_checker_module() -> types.ModuleType:
    """BFCL's ``ast_checker`` module, loaded once without its model-registry import (see the module doc)."""
    global _MODULE
    with _LOCK:
        if _MODULE is None:
            spec = importlib.util.find_spec(_CHECKER)
            if spec is None or spec.origin is None:  # pragma: no cover - bfcl-eval is this env's dependency
                raise ImportError("BFCL-v0 needs the bfcl-eval package: pip install --no-deps bfcl-eval")
            with open(spec.origin, encoding="utf-8") as f:
                source = f.read()
            if source.count(_IMPORT_LINE) != 1:
                raise ImportError(f"{spec.origin}: expected the line {_IMPORT_LINE.strip()!r} once; this "
                                  "bfcl-eval version is not one BFCL-v0 knows how to load")
            module = types.ModuleType("agentgym.envs.bfcl._bfcl_ast_checker")
            module.__file__ = spec.origin
            module.MODEL_CONFIG_MAPPING = _AgentgymModels()
            exec(compile(source.replace(_IMPORT_LINE, "\n"), spec.origin, "exec"), module.__dict__)
            _MODULE = module
    return _MODULE


def language_of(category: str) -> Any:
    """BFCL's ``Language`` for a category (Java and JavaScript values are checked as their source text)."""
    from bfcl_eval.constants.enums import Language
    if category.endswith("_java"):
        return Language.JAVA
    if category.endswith("_javascript"):
        return Language.JAVASCRIPT
    return Language.PYTHON


def decoded(calls: Sequence[Any]) -> list[dict[str, dict[str, Any]]]:
    """Our parsed calls (``.name``, ``.arguments``) in BFCL's decoded format ``[{name: {param: value}}]``."""
    return [{c.name: dict(c.arguments)} for c in calls]


def score_single_turn(task: Mapping[str, Any], calls: Sequence[Any], underscore_to_dot: bool = False) -> dict[str, Any]:
    """BFCL's verdict on one single-turn answer: ``{"valid": bool, "error": [...], "error_type": str}``.

    ``calls`` are the answer's parsed calls (empty: the answer was plain text). The checker's own errors name
    the possible answers: they are privileged (never shown to the policy). A checker that raises on a
    hostile value (BFCL's runner would stop) counts as a rejection, with the exception as the error.
    """
    category = task["category"]
    if is_relevance(category):
        made = bool(calls)
        ok = not made if "irrelevance" in category else made
        return {"valid": ok, "error": [] if ok else ["a call was made" if made else "no call was made"],
                "error_type": "" if ok else ("irrelevance_error:decoder_success" if made
                                             else "relevance_error:decoder_failed")}
    checker = ast_checker_module()
    model = MODEL_NAME_UNDERSCORE if underscore_to_dot else MODEL_NAME
    try:
        result = checker.ast_checker(task["checker_functions"], decoded(calls),
                                     task["ground_truth"], language_of(category), category, model)
    except Exception as e:  # noqa: BLE001 - a model's value must never crash the env
        return {"valid": False, "error": [f"the checker raised {type(e).__name__}: {e}"], "error_type": "checker_error"}
    return {"valid": bool(result["valid"]), "error": list(result.get("error", [])),
            "error_type": str(result.get("error_type", ""))}
