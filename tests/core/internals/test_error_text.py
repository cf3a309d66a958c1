"""The error descriptions that survive a broken ``__str__`` (``_error_text``) and the
exception-group helpers they stand on (``_exception_groups``): unit tests of private
modules' contracts."""

from __future__ import annotations

import trio

from trio_agents._error_text import describe_error, summarize
from trio_agents._exception_groups import first_leaf, leaves, only_cancelled


class _Broken(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


class _NotText(Exception):
    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


def test_describing_an_error_never_raises() -> None:
    assert describe_error(_Broken()) == "_Broken: <str() raised RuntimeError>"
    assert describe_error(_NotText()) == "_NotText: <str() raised TypeError>"
    assert describe_error(ValueError("r\udce9sum\n x")) == "ValueError: r\ufffdsum x"
    assert describe_error(KeyError()) == "KeyError"
    group = ExceptionGroup("g", [_Broken(), ValueError("v")])
    assert summarize(group) == "2 errors: _Broken: <str() raised RuntimeError>; ValueError: v"


def test_a_group_is_described_by_what_is_inside_it() -> None:
    inner = ValueError("v")
    nested = BaseExceptionGroup("outer", [ExceptionGroup("inner", [inner]), KeyError("k")])
    assert leaves(nested) == [inner, nested.exceptions[1]]
    assert first_leaf(nested) is inner
    assert leaves(inner) == [inner]
    assert summarize(ExceptionGroup("g", [inner])) == "ValueError: v"
    assert summarize(ValueError("x" * 600)).endswith("...")
    assert len(summarize(ValueError("x" * 600))) == 500


def test_only_cancelled_looks_through_nested_groups() -> None:
    # trio.Cancelled cannot be made by hand: take a real one from a cancelled scope.
    caught: list[BaseException] = []

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            try:
                await trio.lowlevel.checkpoint()
            except trio.Cancelled as exc:
                caught.append(exc)
                raise

    trio.run(main)
    (cancelled,) = caught
    assert only_cancelled(cancelled)
    assert only_cancelled(BaseExceptionGroup("g", [BaseExceptionGroup("h", [cancelled])]))
    assert not only_cancelled(BaseExceptionGroup("g", [cancelled, ValueError("v")]))
    assert not only_cancelled(ValueError("v"))
    # With a real error beside it, a Cancelled leaf is left out of the summary.
    assert summarize(BaseExceptionGroup("g", [cancelled, ValueError("v")])) == "ValueError: v"
    assert summarize(cancelled) == "a stray trio.Cancelled"
