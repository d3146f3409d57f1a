"""BFCL v4's shipped data: the categories ``BFCL-v0`` offers, their tasks, and tool specs from BFCL's docs.

Everything is read from the installed ``bfcl-eval`` package (``bfcl_eval/data/BFCL_v4_<category>.json``,
``possible_answer/`` and ``multi_turn_func_doc/``; JSON lines), offline, once per category per process.
A task is plain data (what ``info["privileged"]["task"]`` holds): the id, the category, the user turns,
the function docs twice (as the model sees them, with BFCL's language hints, and as BFCL's checker reads
them), and the possible answers (single-turn) or ground-truth call lists (multi-turn).

Why the rules here are BFCL's own: the function docs of a multi-turn entry are the docs of its involved
classes, minus the held-out functions of ``multi_turn_miss_func`` (which come back at their turn); that is
``bfcl_eval.utils.populate_test_cases_with_predefined_functions``, redone here with agentgym's JSON-lines
reader because BFCL's loader takes a file lock inside site-packages. The language hints are applied with
BFCL's own ``add_language_specific_hint_to_function_doc``.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
from pathlib import Path
from typing import Any

from agentgym.jsonl import read_jsonl

from .multi_turn import ground_truth_calls

__all__ = ["SINGLE_TURN", "MULTI_TURN", "CATEGORIES", "UNSUPPORTED", "check_category", "load_tasks",
           "is_multi_turn", "is_relevance", "tool_spec", "to_json_schema"]

#: single-turn categories: one user request, answered by calls that BFCL's AST checker judges
SINGLE_TURN = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
               "irrelevance", "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
               "live_irrelevance", "live_relevance")
#: multi-turn categories: stateful API classes, one user turn after another
MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
CATEGORIES = SINGLE_TURN + MULTI_TURN
#: shipped categories this env does not offer, and why (named in the error for an unknown category)
UNSUPPORTED = {
    "web_search": "needs the internet (BFCL calls a live search API)",
    "memory": "each entry depends on earlier prerequisite conversations and a memory backend",
    "format_sensitivity": "not scored by BFCL (it varies the prompt format of other categories)",
}


def _data_dir() -> Path:
    try:
        return Path(str(importlib.resources.files("bfcl_eval") / "data"))
    except ModuleNotFoundError as e:  # pragma: no cover - the package is a dependency of this env
        raise ImportError("BFCL-v0 needs the bfcl-eval package: pip install --no-deps bfcl-eval") from e


def check_category(category: str) -> str:
    """``category`` if BFCL-v0 offers it, else a one-line ``ValueError`` naming the valid ones."""
    if category in CATEGORIES:
        return category
    why = next((f" ({k}: {v})" for k, v in UNSUPPORTED.items() if str(category).startswith(k)), "")
    raise ValueError(f"unknown BFCL category {category!r}{why}; choose one of: {', '.join(CATEGORIES)}")


def is_multi_turn(category: str) -> bool:
    return category in MULTI_TURN


def is_relevance(category: str) -> bool:
    """Categories scored on whether any call was made at all (no possible answers)."""
    return category in ("irrelevance", "live_irrelevance", "live_relevance")


def _read(path: Path) -> list[dict[str, Any]]:
    return [row for _, row in read_jsonl(path, what="BFCL data")]


@functools.lru_cache(maxsize=None)
def _func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING
    return tuple(_read(_data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]))


def _with_functions(entry: dict[str, Any]) -> dict[str, Any]:
    """A multi-turn entry with its ``function`` docs (the involved classes' docs, held-out ones removed and
    kept per turn under ``missed_function``), as BFCL's ``populate_test_cases_with_predefined_functions``."""
    docs = [d for c in entry["involved_classes"] for d in _func_docs(c)]  # shared: never mutated
    missed: dict[str, list[dict[str, Any]]] = {}
    for turn, names in entry.get("missed_function", {}).items():
        missed[turn] = []
        for name in names:
            hit = next((i for i, d in enumerate(docs) if d["name"] == name), None)
            if hit is not None:
                missed[turn].append(docs.pop(hit))
    entry["function"] = docs
    if "missed_function" in entry:
        entry["missed_function"] = missed
    return entry


def _hinted(entries: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The function docs as the model sees them: BFCL's language hints (and, for Java/JavaScript, every
    parameter typed ``string``), applied by BFCL's own function to a copy."""
    from bfcl_eval.utils import add_language_specific_hint_to_function_doc
    copies = [{"id": e["id"], "function": copy.deepcopy(e["function"])} for e in entries]
    return [e["function"] for e in add_language_specific_hint_to_function_doc(copies)]


@functools.lru_cache(maxsize=None)
def load_tasks(category: str) -> tuple[dict[str, Any], ...]:
    """Every task of ``category`` in the package's order (cached; callers get deep copies from the env)."""
    check_category(category)
    data = _data_dir()
    entries = _read(data / f"BFCL_v4_{category}.json")
    answers = {} if is_relevance(category) else {
        row["id"]: row["ground_truth"] for row in _read(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    if is_multi_turn(category):
        entries = [_with_functions(e) for e in entries]
        hinted = {d["name"]: h for c in {c for e in entries for c in e["involved_classes"]}
                  for d, h in zip(_func_docs(c), _hinted_class_docs(c, category))}
        shown = [[hinted[d["name"]] for d in e["function"]] for e in entries]
    else:
        shown = _hinted(entries)
    tasks = []
    for entry, docs in zip(entries, shown):
        task: dict[str, Any] = {"id": entry["id"], "category": category, "question": entry["question"],
                                "functions": docs, "checker_functions": entry["function"]}
        if entry["id"] in answers:
            task["ground_truth"] = answers[entry["id"]]
        elif not is_relevance(category):
            raise ValueError(f"BFCL data: no possible answer for {entry['id']}")
        if is_multi_turn(category):
            task.update(initial_config=entry["initial_config"], involved_classes=entry["involved_classes"],
                        missed_function=_hinted_missed(entry, category))
            task["oracle_calls"] = ground_truth_calls(task)
        tasks.append(task)
    return tuple(tasks)


@functools.lru_cache(maxsize=None)
def _hinted_class_docs(class_name: str, category: str) -> tuple[dict[str, Any], ...]:
    """One API class's docs with the hints of ``category`` (the same for every entry of a category)."""
    return tuple(_hinted([{"id": f"{category}_0", "function": list(_func_docs(class_name))}])[0])


def _hinted_missed(entry: dict[str, Any], category: str) -> dict[str, list[dict[str, Any]]]:
    hinted = {h["name"]: h for c in entry["involved_classes"] for h in _hinted_class_docs(c, category)}
    return {t: [hinted[d["name"]] for d in docs] for t, docs in entry.get("missed_function", {}).items()}


# --------------------------------------------------------------------------- tool specs
def to_json_schema(schema: Any) -> Any:
    """BFCL's parameter types (``dict``, ``float``, ``tuple``, ``any``, Java's ``ArrayList`` …) as JSON Schema
    types, through BFCL's own ``GORILLA_TO_OPENAPI`` table (unknown types become ``string``, as BFCL's
    handlers do), recursively through ``properties`` and ``items``."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "type" in out and isinstance(out["type"], str):
        out["type"] = GORILLA_TO_OPENAPI.get(out["type"], "string")
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: to_json_schema(v) for k, v in out["properties"].items()}
    if "items" in out:
        out["items"] = to_json_schema(out["items"])
    return out


def tool_spec(doc: dict[str, Any]) -> dict[str, Any]:
    """One BFCL function doc as an OpenAI / HF chat-template tool spec."""
    params = to_json_schema(doc.get("parameters", {"type": "dict", "properties": {}}))
    params["type"] = "object"
    return {"type": "function", "function": {"name": doc["name"], "description": doc.get("description", ""),
                                             "parameters": params}}
