"""Typed configs: dataclasses loaded from YAML / dicts with dotted ``key=value`` overrides.

Unknown keys and wrongly typed values are errors that name the key, so a typo in a config
never silently falls back to a default. Every knob carries a one-line help in its field metadata
(``field(default=..., metadata={"help": ...})``, as TRL's configs do); :func:`config_fields` walks a
config and :func:`format_config_table` prints every knob with its type, default and help.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping, NamedTuple, Sequence, TypeVar

__all__ = ["ConfigError", "from_dict", "to_dict", "load_config", "apply_overrides", "parse_value", "save_config",
           "canonical_key", "same_config",
           "ConfigField", "config_fields", "format_config_table"]

T = TypeVar("T")


class ConfigError(ValueError):
    pass


def _key_hint(key: str, names: Collection[str], hints: Mapping[str, Any], section: str) -> str:
    """`` (did you mean 'steps'?)`` for a mistyped key: the closest key of this section or of the configs
    nested in it, two levels down (``lr`` at the top level: ``optim.lr``; ``rollout.max_new_token``:
    ``rollout.sampling.max_new_tokens``); a key of this section comes alone, a nested key that stands in
    several sections is named in each. Empty when nothing is close."""
    import difflib

    pool: dict[str, list[str]] = {name: [name] for name in sorted(names)}
    level = [("", hints)]
    for _ in range(2):
        deeper = []
        for prefix, level_hints in level:
            for name, tp in sorted(level_hints.items()):
                if dataclasses.is_dataclass(tp):
                    try:
                        sub_hints = typing.get_type_hints(tp)
                    except Exception:   # a hint that does not resolve: no guess from there, the error stands
                        continue
                    for f in dataclasses.fields(tp):
                        if f.init and f.name not in names:
                            pool.setdefault(f.name, []).append(f"{prefix}{name}.{f.name}")
                    deeper.append((f"{prefix}{name}.", sub_hints))
        level = deeper
    close = difflib.get_close_matches(key, list(pool), n=1)
    if not close:
        return ""
    return f" (did you mean {' or '.join(repr(_join(section, path)) for path in pool[close[0]])}?)"


def _join(section: str, key: str) -> str:
    """The dotted path of ``key`` inside ``section`` (``""`` is the top level).

    One place builds config paths so that an error names ``rollout.sampling.top_p`` or, for a
    whole section, ``rollout.sampling`` -- never ``rollout.sampling.`` with a dangling separator.
    A trailing dot on ``section`` (the former ``prefix`` convention) is tolerated.
    """
    section = section.rstrip(".")
    return f"{section}.{key}" if section else key


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: {value!r} matches none of {tp}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {type(value).__name__}")
        return from_dict(tp, value, prefix=where)
    if origin in (list, tuple, Sequence):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)[:1] or (Any,)
        items = [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-5" (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if tp is int and isinstance(value, bool):
        raise ConfigError(f"{where}: expected int, got bool")
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} ({value!r})")
    return value


def _aliases(cls: Any) -> dict[str, str]:
    """``cls.config_aliases``: short or former dotted keys -> their canonical dotted path.

    One setting has one home (e.g. ``TrainConfig.rollout.sampling.temperature``); aliases let users
    keep typing the short spelling (``sampling.temperature=0.7``) without a second copy of the field.
    """
    return dict(getattr(cls, "config_aliases", {}) or {})


def canonical_key(cls: Any, key: str) -> str:
    """The canonical dotted path of ``key`` for config class ``cls`` (longest alias prefix wins)."""
    parts = key.split(".")
    aliases = _aliases(cls)
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in aliases:
            return ".".join([aliases[head], *parts[n:]])
    return key


def _pop_path(data: dict[str, Any], path: list[str]) -> tuple[bool, Any]:
    node: Any = data
    for p in path[:-1]:
        if not isinstance(node, dict) or p not in node:
            return False, None
        node = node[p]
    if not isinstance(node, dict) or path[-1] not in node:
        return False, None
    value = node.pop(path[-1])
    return True, value


def _canonicalize(cls: Any, data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with every alias key moved to its canonical path (merged into what is there)."""
    def copy_maps(x: Any) -> Any:
        return {k: copy_maps(v) for k, v in x.items()} if isinstance(x, Mapping) else x
    out: dict[str, Any] = copy_maps(data)
    for alias in sorted(_aliases(cls), key=lambda a: -a.count(".")):
        found, value = _pop_path(out, alias.split("."))
        if not found:
            continue
        target = _aliases(cls)[alias].split(".")
        node = out
        for p in target[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"{alias}: {'.'.join(target)} is not a section")
            node = nxt
        if isinstance(value, Mapping) and isinstance(node.get(target[-1]), dict):
            node[target[-1]] = _merge(node[target[-1]], value)
        else:
            node[target[-1]] = value
    return out


def from_dict(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, recursively, checking keys and types.

    ``prefix``: the dotted path of this section in the whole config (``"rollout.sampling"``; empty at
    the top level), used to name keys in errors.
    """
    section = prefix.rstrip(".")
    if _aliases(cls) and any(k.split(".")[0] in data for k in _aliases(cls)):
        data = _canonicalize(cls, data)
    hints = _section_types(cls, data, section)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = set(data) - names
    if unknown:
        renamed = getattr(cls, "config_renamed", {}) or {}
        for k in sorted(unknown):
            if k in renamed:
                raise ConfigError(f"{_join(section, k)} was renamed {renamed[k]}")
        named = ", ".join(_join(section, k) + _key_hint(k, names, hints, section) for k in sorted(unknown))
        owner = f" (not settings of {cls.__name__})" if getattr(cls, "config_named_in_errors", False) else ""
        raise ConfigError(f"unknown config key(s) {named}{owner}; valid: {', '.join(sorted(names))}")
    kwargs = {k: _coerce(v, hints[k], _join(section, k)) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        # the section's own check failed (e.g. SamplingConfig's top_p range): name the section
        raise ConfigError(f"{section or cls.__name__}: {e}") from None


def _section_types(cls: Any, data: Mapping[str, Any], section: str) -> dict[str, Any]:
    """``cls``'s field types, with each section whose class depends on another field resolved:
    metadata ``{"defaults_belong_to": OWNER, "type_by_owner": fn}`` makes the section's class
    ``fn(value of OWNER)`` (``TrainConfig.learner``: the chosen ``algo``'s typed config)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        choose = f.metadata.get("type_by_owner")
        if choose is None:
            continue
        owner = f.metadata["defaults_belong_to"]
        value = data.get(owner, next(o.default for o in dataclasses.fields(cls) if o.name == owner))
        try:
            hints[f.name] = choose(value)
        except ValueError as e:
            raise ConfigError(f"{_join(section, owner)}: {e}") from None
    return hints


def to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def same_config(recorded: Mapping[str, Any], current: Mapping[str, Any], defaults: Mapping[str, Any],
                ignore: Collection[str] = (), _section: str = "") -> bool:
    """Whether a config recorded by an earlier run (``to_dict``) is ``current``'s, for resuming or reusing
    that run: equal, except that a key the record lacks counts as equal when ``current`` holds its default
    (``defaults``: ``to_dict`` of the config class built with no arguments). A knob added after the run was
    recorded, left at its default, does not make the run a different one; a knob set otherwise does.
    ``ignore``: dotted keys (``"learner.micro_batch_size"``) that may differ, because they change how a run
    is computed or where it is written, not what it learns (``TrainConfig.RESULT_NEUTRAL``)."""
    for key in set(recorded) | set(current):
        if _join(_section, key) in ignore:
            continue
        if key not in current:
            return False
        if key not in recorded:
            if key not in defaults or current[key] != defaults[key]:
                return False
        elif isinstance(recorded[key], Mapping) and isinstance(current[key], Mapping) \
                and isinstance(defaults.get(key), Mapping):
            if not same_config(recorded[key], current[key], defaults[key], ignore, _join(_section, key)):
                return False
        elif recorded[key] != current[key]:
            return False
    return True


def parse_value(text: str) -> Any:
    """The value of a ``KEY=VALUE`` on any command line, read as YAML (JSON is YAML too): ``3`` is an int,
    ``'{exact_match: 1, brevity: 0.1}'`` a mapping, ``[1, 2]`` a list; text that is not YAML stays a
    string. The one parser of every command's values (``train`` overrides and ``eval -e`` alike), so a
    value the docs show works wherever it is typed."""
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``["optim.lr=1e-5", "steps=3"]`` applied to a nested dict (values parsed as YAML)."""
    data = json.loads(json.dumps(data))  # deep copy of plain data
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"override {o!r} is not key=value")
        key, raw = o.split("=", 1)
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r}: {p!r} is not a section")
        node[parts[-1]] = parse_value(raw)
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = (),
                base: Mapping[str, Any] | None = None) -> T:
    """Defaults of ``cls`` (updated by ``base``, e.g. a run's saved layout), then the YAML file at
    ``path``, then ``overrides``. Alias keys (``cls.config_aliases``) are accepted at every layer.

    Mappings in the file merge into the defaults key by key, except that a field whose metadata says
    ``{"defaults_belong_to": NAME}`` starts empty when the file or an override changes field ``NAME``:
    ``TrainConfig.env_kwargs`` holds the default env's arguments, which another env would reject.
    """
    import yaml
    data = to_dict(cls())
    loaded: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file {path} not found") from None
        except IsADirectoryError:
            raise ConfigError(f"config file {path} is a directory; give a YAML file") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not text (YAML expected)") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            what = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"config file {path} is not valid YAML{where}: {what}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
    loaded = _canonicalize(cls, loaded)
    overrides = [_canonical_override(cls, overrides, i) for i in range(len(overrides))]
    _drop_foreign_defaults(cls, data, loaded, overrides)
    if base:
        data = _merge(data, _canonicalize(cls, base))
    data = _merge(data, loaded)
    data = apply_overrides(data, overrides)
    return from_dict(cls, data)


def _canonical_override(cls: Any, overrides: Sequence[str], i: int) -> str:
    """Override ``i`` with its key in canonical form (its neighbours only name a shell-split value)."""
    override = overrides[i]
    key, sep, raw = override.partition("=")
    if not sep:
        hint = f" (a config file? --config {override})" if override.endswith((".yaml", ".yml", ".json")) else ""
        whole = _shell_split(overrides, i)
        if whole:
            hint = f" (the shell split a value at its spaces: quote the whole override, e.g. '{whole}')"
        raise ConfigError(f"override {override!r} is not key=value{hint}")
    if not key.strip():
        raise ConfigError(f"override {override!r} has no key before '='")
    return f"{canonical_key(cls, key.strip())}={raw}"


def _shell_split(overrides: Sequence[str], i: int) -> str | None:
    """When word ``i`` (no ``=``) is the rest of an earlier override whose value the shell cut at a space
    (``env_kwargs={difficulty: 2}`` typed unquoted arrives as two words), that override, whole."""
    start = i - 1
    while start >= 0 and "=" not in overrides[start]:
        start -= 1
    if start < 0 or not _unclosed(overrides[start].partition("=")[2]):
        return None
    end = i
    while _unclosed(" ".join(overrides[start:end + 1]).partition("=")[2]) and end + 1 < len(overrides) \
            and "=" not in overrides[end + 1].split(":")[0]:
        end += 1
    return " ".join(overrides[start:end + 1])


def _unclosed(value: str) -> bool:
    """A YAML flow value cut short: more ``{``/``[`` than ``}``/``]``, or an open quote."""
    return (value.count("{") > value.count("}") or value.count("[") > value.count("]")
            or value.count('"') % 2 == 1 or value.count("'") % 2 == 1)


def _drop_foreign_defaults(cls: type, data: dict[str, Any], loaded: Mapping[str, Any], overrides: Sequence[str]) -> None:
    """Empty (in place) the default of each field whose defaults belong to a field the user changed."""
    for f in dataclasses.fields(cls):
        owner = f.metadata.get("defaults_belong_to")
        if owner is None:
            continue
        chosen = loaded.get(owner, data.get(owner))
        for o in overrides:
            key, sep, raw = o.partition("=")
            if sep and key.strip() == owner:
                chosen = parse_value(raw)
        if chosen != data.get(owner):
            data[f.name] = type(data[f.name])() if isinstance(data[f.name], (dict, list)) else None


def _merge(base: dict[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict) and out[k]:
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def save_config(obj: Any, path: str | Path) -> None:
    import yaml
    Path(path).write_text(yaml.safe_dump(to_dict(obj), sort_keys=False))


class ConfigField(NamedTuple):
    """One knob of a config tree: its dotted ``path``, its ``type`` as written, its resolved ``default``
    and its one-line ``help`` (``""`` when the field has none)."""
    path: str
    type: str
    default: Any
    help: str


def _type_text(tp: Any) -> str:
    if isinstance(tp, str):  # ``from __future__ import annotations``: the annotation as written
        return tp
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def config_fields(config: Any, prefix: str = "") -> Iterator[ConfigField]:
    """Every knob of ``config`` (a config dataclass, or an instance of one), nested sections recursed.

    Defaults are read off an instance (``config()`` for a class), so a section whose default comes from
    a factory (``TrainConfig.optim.lr``) shows the value a run gets. A section is a field whose value
    is a dataclass; it is yielded itself (default ``"(section)"``) before its knobs.
    """
    obj = config() if isinstance(config, type) else config
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        path, value = _join(prefix, f.name), getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield ConfigField(path, _type_text(f.type), "(section)", f.metadata.get("help", ""))
            yield from config_fields(value, path)
        else:
            yield ConfigField(path, _type_text(f.type), value, f.metadata.get("help", ""))


def format_config_table(config: Any, title: str | None = None, *, prefix: str = "",
                        keep: Callable[[ConfigField], bool] | None = None) -> str:
    """A plain-text table of :func:`config_fields` (paths under ``prefix``; only the knobs ``keep``
    accepts, when given): one line per knob, ``path  type  default  help``."""
    rows = [(k.path, k.type, json.dumps(k.default, default=str) if k.default != "(section)" else "", k.help)
            for k in config_fields(config, prefix) if keep is None or keep(k)]
    # a long default (a dict) overflows its own line rather than pushing every help to the right
    widths = [min(cap, max(len(r[i]) for r in rows + [("path", "type", "default", "")]))
              for i, cap in enumerate((40, 24, 16))]
    lines = [f"{title}\n" if title else ""]
    lines.append("  ".join(h.ljust(w) for h, w in zip(("path", "type", "default"), widths)) + "  help")
    lines += ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows]
    return "\n".join(line.rstrip() for line in lines if line != "") + "\n"
