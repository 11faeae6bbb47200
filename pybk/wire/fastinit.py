"""A quicker ``__init__`` for the wire's frozen, slotted dataclasses (built per message).

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__(self,
name, value)`` (its own ``__setattr__`` refuses), which looks the slot up by name for every
field. :func:`fast_init` gives the class an ``__init__`` that calls each slot's descriptor
directly instead: the same parameters, order, defaults and result.
"""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """Replace ``cls.__init__`` (a frozen, slotted dataclass whose fields are all plain init
    parameters with constant defaults, and no ``__post_init__``) by one setting the slots
    through their descriptors. ValueError for any other class."""
    if not is_dataclass(cls) or "__slots__" not in vars(cls) or hasattr(cls, "__post_init__"):
        raise ValueError(f"{cls.__name__}: not a slotted dataclass without __post_init__")
    params: list[str] = []
    body: list[str] = []
    namespace: dict[str, Any] = {}
    for f in fields(cls):
        if not f.init or f.kw_only or f.default_factory is not MISSING:
            raise ValueError(f"{cls.__name__}.{f.name}: not a plain init parameter")
        if f.default is MISSING:
            params.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        namespace[f"_set_{f.name}"] = vars(cls)[f.name].__set__
        body.append(f"    _set_{f.name}(self, {f.name})")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["    pass"])
    exec(source, namespace)  # (as dataclasses itself makes __init__)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    old: Any = vars(cls)["__init__"]
    init.__annotations__ = dict(old.__annotations__)
    init.__doc__ = old.__doc__
    setattr(cls, "__init__", init)  # noqa: B010  (a class attribute replaced on purpose)
    return cls
