"""Typed configs: dataclasses loaded from YAML / dicts with dotted ``key=value`` overrides.

Unknown keys and wrongly typed values are errors that name the key, so a typo in a config
never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

__all__ = ["ConfigError", "from_dict", "to_dict", "load_config", "apply_overrides", "save_config"]

T = TypeVar("T")


class ConfigError(ValueError):
    pass


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
        return from_dict(tp, value, prefix=where + ".")
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


def from_dict(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, recursively, checking keys and types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(prefix + k for k in sorted(unknown))}; "
                          f"valid: {', '.join(sorted(names))}")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{prefix or cls.__name__}: {e}") from None


def to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _parse_value(text: str) -> Any:
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``["learner.lr=1e-5", "steps=3"]`` applied to a nested dict (values parsed as YAML)."""
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
        node[parts[-1]] = _parse_value(raw)
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Defaults of ``cls``, updated by the YAML file at ``path``, then by ``overrides``.

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
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
    _drop_foreign_defaults(cls, data, loaded, overrides)
    data = _merge(data, loaded)
    data = apply_overrides(data, overrides)
    return from_dict(cls, data)


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
                chosen = _parse_value(raw)
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
