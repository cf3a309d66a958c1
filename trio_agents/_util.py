"""Small helpers shared by the run core and the control server (unit-tested on their own).

Exception groups: Trio's nurseries are strict (they wrap even a single error), so the
library boundary has to look inside groups. These helpers never unwrap a group that
holds several real errors; they only *describe* it.
"""

from __future__ import annotations

import trio

__all__ = ["first_leaf", "leaves", "only_cancelled", "summarize"]

_MAX_REASON = 500


def only_cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``trio.Cancelled`` or a group (of groups) of nothing else."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(only_cancelled(e) for e in exc.exceptions)
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


def _one(exc: BaseException) -> str:
    if isinstance(exc, trio.Cancelled):  # only summarised when nothing asked for it
        return "a stray trio.Cancelled"
    text = " ".join(str(exc).split())  # one line, whatever the message held
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def summarize(exc: BaseException) -> str:
    """A one-line summary of an error for ``RunResult.reason`` (at most 500 chars).

    Groups are described by what is inside them, never by the group's own message:
    one real error reads as that error; several read as ``"2 errors: A: x; B: y"``.
    ``trio.Cancelled`` leaves are left out when real errors sit beside them.
    """
    found = leaves(exc)
    real = [e for e in found if not isinstance(e, trio.Cancelled)] or found
    if len(real) == 1:
        summary = _one(real[0])
    else:
        summary = f"{len(real)} errors: " + "; ".join(_one(e) for e in real)
    return summary if len(summary) <= _MAX_REASON else summary[: _MAX_REASON - 3] + "..."
