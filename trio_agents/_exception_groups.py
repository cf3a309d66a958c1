"""Looking inside exception groups: Trio's nurseries are strict (they wrap even a single
error), so the library's boundaries have to look inside groups. These helpers never
unwrap a group that holds several real errors; they only find what is inside one.
"""

from __future__ import annotations

import trio

__all__ = ["first_leaf", "leaves", "only_cancelled"]


def only_cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``trio.Cancelled`` or a group (of groups) of nothing else."""
    # type(), not isinstance(): trio.Cancelled is final, and isinstance() of anything
    # else (a group) goes through its ABCMeta.__instancecheck__, two Python calls.
    if type(exc) is trio.Cancelled:
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(only_cancelled(inner) for inner in exc.exceptions)
    return False


def leaves(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc``, depth first (``[exc]`` for a plain one)."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    found: list[BaseException] = []
    for inner in exc.exceptions:
        found.extend(leaves(inner))
    return found


def first_leaf(exc: BaseException) -> BaseException:
    """The first non-group exception inside ``exc``."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
