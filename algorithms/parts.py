"""One registry helper for every registered part: learners, advantage estimators, objectives.

A :class:`Registry` is a ``dict`` from a normalised name (lower case, stripped; no ``:``, ``,`` or
``=``, which the command line uses as separators) to a part, with the two errors a user meets: an
unknown name lists the registered ones, and a second registration under a taken name needs
``replace=True``. Parts are added with :meth:`Registry.add` or with the ``register_*`` helpers of
their modules, which use :meth:`Registry.decorator` so that they also work as decorators.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["Registry", "registry_key"]


def registry_key(name: str) -> str:
    """The normalised form of a part's name (what the registry stores and looks up)."""
    key = str(name).strip().lower()
    if not key or ":" in key or "," in key or "=" in key:
        raise ValueError(f"a registered name must be non-empty and free of ':', ',' and '=', got {name!r}")
    return key


class Registry(dict):
    """``name -> part``; ``what`` names the kind of part in messages (``"advantage estimator"``) and
    ``hint`` adds a short explanation to the unknown-name error."""

    def __init__(self, what: str, hint: str = ""):
        super().__init__()
        self.what = what
        self.hint = hint

    def lookup(self, name: str) -> Any:
        """The part registered as ``name``; ValueError listing the registered names if none is."""
        try:
            return self[registry_key(name)]
        except KeyError:
            hint = f" ({self.hint})" if self.hint else ""
            raise ValueError(f"unknown {self.what} {name!r}{hint}; registered: {', '.join(sorted(self))}") from None

    def add(self, name: str, part: Any, replace: bool = False) -> str:
        """Register ``part`` under ``name``; returns the normalised name."""
        key = registry_key(name)
        if key in self and self[key] is not part and not replace:
            raise ValueError(f"{self.what} {key!r} is already registered (pass replace=True to override it)")
        self[key] = part
        return key

    def decorator(self, name: str, obj: Any, base: type, wrap: Callable[[Callable], type], replace: bool) -> Any:
        """Register ``obj`` — a ``base`` subclass, or a function that ``wrap`` turns into one — under
        ``name`` and return ``obj``; with ``obj=None``, a decorator that does so. The class gets ``name``."""
        def add(o: Any) -> Any:
            if isinstance(o, type) and issubclass(o, base):
                cls = o
            elif callable(o):
                cls = wrap(o)
            else:
                raise TypeError(f"registering {self.what} {name!r} needs a subclass of {base.__name__} or a function")
            cls.name = registry_key(name)
            self.add(name, cls, replace)
            return o
        return add if obj is None else add(obj)
