"""Read-only JSON trees: the tool and output schemas every run of an agent shares.

A run used to deep-copy each tool's schema, so that a model (or a hook, or a user
holding a ``ModelRequest``) that changed ``request.tools[i].parameters`` could not
change the tool for other runs. Now each schema is frozen once, when the tool (or the
agent's output type) is made, and every run and request shares it: changing it raises
``TypeError`` instead.

:class:`FrozenDict` and :class:`FrozenList` are subclasses of ``dict`` and ``list``, not
``MappingProxyType`` or tuples, so that everything that reads a schema keeps working
unchanged: ``json.dumps`` (the providers' request bodies), ``isinstance(x, dict)``
checks, equality with plain dicts and lists. ``dict(schema)`` and ``schema.copy()`` give
a plain (shallow) dict; ``copy.deepcopy(schema)`` gives a plain, fully mutable copy.

What no ``dict``/``list`` subclass can refuse: the base class's own methods called on
the object (``dict.__setitem__(schema, k, v)``, ``dict.__init__(schema, ...)``,
``list.append(...)``, ``object.__setattr__(schema, "__class__", dict)``). Everything
reached *through* the object — its methods, operators, a second ``schema.__init__``,
``schema.__class__ = dict`` — raises ``TypeError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn, SupportsIndex

__all__ = ["FrozenDict", "FrozenList", "freeze_json", "thaw_json"]

_MESSAGE = (
    "this JSON schema is shared by every run and read-only;"
    " change a copy (copy.deepcopy(schema) is a plain, mutable one)"
)


def _refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise TypeError(_MESSAGE)


class FrozenDict(dict[str, Any]):
    """A ``dict`` that refuses every change (see the module docstring)."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Built by _frozen_dict, never by __init__: the inherited dict.__init__ would
        # update the shared tree in place (schema.__init__({...})).
        _refuse()

    # schema.__class__ = dict would make the shared tree a plain, mutable dict.
    __setattr__ = _refuse
    __delattr__ = _refuse

    def __setitem__(self, key: str, value: Any) -> NoReturn:
        _refuse()

    def __delitem__(self, key: str) -> NoReturn:
        _refuse()

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse()

    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        thawed: dict[str, Any] = thaw_json(self)
        return thawed

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as a plain dict, frozen again when loaded.
        return (freeze_json, (thaw_json(self),))


class FrozenList(list[Any]):
    """A ``list`` that refuses every change (see the module docstring)."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Built by _frozen_list: the inherited list.__init__ clears and refills in place.
        _refuse()

    __setattr__ = _refuse
    __delattr__ = _refuse

    def __setitem__(self, index: SupportsIndex | slice, value: Any) -> NoReturn:
        _refuse()

    def __delitem__(self, index: SupportsIndex | slice) -> NoReturn:
        _refuse()

    def __iadd__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse()

    def __imul__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse()

    append = _refuse
    extend = _refuse
    insert = _refuse
    pop = _refuse
    remove = _refuse
    clear = _refuse
    sort = _refuse
    reverse = _refuse

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        thawed: list[Any] = thaw_json(self)
        return thawed

    def __reduce__(self) -> tuple[Any, ...]:
        return (freeze_json, (thaw_json(self),))


_SCALARS = frozenset({str, int, float, bool, type(None)})


def freeze_json(value: Any) -> Any:
    """A read-only copy of a JSON-like tree: mappings become :class:`FrozenDict`, lists
    and tuples :class:`FrozenList`; scalars (and anything else) are kept as they are.
    A tree that is already frozen is returned as is (it was copied when frozen)."""
    kind = type(value)
    if kind in _SCALARS or kind is FrozenDict or kind is FrozenList:
        return value
    if isinstance(value, Mapping):
        return _frozen_dict({key: freeze_json(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return _frozen_list([freeze_json(item) for item in value])
    return value


def _frozen_dict(items: dict[str, Any]) -> FrozenDict:
    """Fill a new FrozenDict through the base class (its own ``__init__`` refuses)."""
    frozen = dict.__new__(FrozenDict)
    dict.update(frozen, items)
    return frozen


def _frozen_list(items: list[Any]) -> FrozenList:
    frozen = list.__new__(FrozenList)
    list.extend(frozen, items)
    return frozen


def thaw_json(value: Any) -> Any:
    """A plain, mutable deep copy of a (frozen) JSON-like tree."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if isinstance(value, Mapping):
        return {key: thaw_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [thaw_json(item) for item in value]
    return value
