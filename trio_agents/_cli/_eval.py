"""``trio-agents eval CASES --app MOD:ATTR``: run a dataset of cases against agents.

Progress goes to stderr while the cases run (a bar on a terminal, one line per case
otherwise); the report table and the score to stdout; ``--json`` writes the whole result
(every case's run and events); ``--compare`` shows what changed since a previous
``--json``; ``--threshold`` makes the exit status 1 when the share of cases that passed
is below it, so the command gates CI. Ctrl-C or SIGTERM cancels every run, writes the
partial result, and exits 130.

pydantic-evals (the ``evals`` extra) is imported only when the command runs, so the rest
of the command line works without it.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TextIO

import trio

from ._errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, CLIError

if TYPE_CHECKING:
    from ..evals import CaseOutcome, EvalResult, Evaluation

__all__ = ["add_eval", "eval_command"]

_BAR: Final = 30


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1 (a share)")
    return value


def add_eval(commands: argparse._SubParsersAction[Any], seconds: Any, count: Any) -> None:
    """The ``eval`` subcommand's arguments (``seconds``, ``count``: the parser's types
    of a duration and of a count)."""
    command = commands.add_parser(
        "eval",
        help="run a dataset of cases against your agents and report (the evals extra)",
        description="Run every case of a dataset file (YAML or JSON, pydantic-evals'"
        " format) against your agents, concurrently; print a report, write JSON, and"
        " exit 1 when the share of passed cases is under --threshold.",
    )
    command.add_argument("cases", metavar="CASES", help="the dataset file (.yaml, .yml, .json)")
    command.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        required=True,
        help="your agents, as for serve: a mapping of name -> Agent, an Agent, or a"
        " function returning either (a case picks one with inputs.agent)",
    )
    command.add_argument(
        "--json", metavar="PATH", default=None, help="write the whole result here (JSON)"
    )
    command.add_argument(
        "--compare",
        metavar="PREVIOUS",
        default=None,
        help="a previous --json: show what changed (regressions, improvements)",
    )
    command.add_argument(
        "--threshold",
        metavar="SHARE",
        type=_threshold,
        default=None,
        help="exit 1 when the share of cases that passed is below it (0 to 1)",
    )
    command.add_argument(
        "--concurrency",
        metavar="N",
        type=count,
        default=8,
        help="cases running at once (default 8)",
    )
    command.add_argument(
        "--deadline",
        metavar="SECONDS",
        type=seconds,
        default=None,
        help="each case's run ends failed ('timeout') after this long",
    )


def _progress(err: TextIO) -> Callable[[CaseOutcome], None]:
    tty = err.isatty()

    def show(outcome: CaseOutcome) -> None:
        if tty:
            filled = round(_BAR * outcome.done / outcome.total)
            bar = "#" * filled + "-" * (_BAR - filled)
            end = "\n" if outcome.done == outcome.total else ""
            err.write(f"\r[{bar}] {outcome.done}/{outcome.total} {outcome.name[:40]:<40}{end}")
        else:
            status = f" (run {outcome.status})" if outcome.status else ""
            err.write(
                f"[{outcome.done}/{outcome.total}] {outcome.name}: {outcome.verdict}{status}\n"
            )
        err.flush()

    return show


async def _run(evaluation: Evaluation, err: TextIO) -> bool:
    """Run the eval until it ends or a signal comes; True if it was interrupted."""
    interrupted = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal interrupted
                async for _signal in signals:
                    interrupted = True
                    nursery.cancel_scope.cancel(reason="interrupted")
                    return

            nursery.start_soon(watch)
            await evaluation.run()
            nursery.cancel_scope.cancel()
    if interrupted and err.isatty():
        err.write("\n")
    return interrupted


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    try:
        from .. import evals
    except ImportError as exc:
        raise CLIError(f"{exc} (the eval command needs it)") from None
    from ._serve import load_app

    agents = load_app(args.app)
    try:
        dataset = evals.load_dataset(args.cases)
    except (OSError, ValueError) as exc:
        raise CLIError(f"cannot read the cases: {exc}", status=EXIT_USAGE) from None
    baseline = None
    if args.compare is not None:
        try:
            baseline = evals.load_report(args.compare)
        except (OSError, ValueError) as exc:
            raise CLIError(f"--compare: {exc}", status=EXIT_USAGE) from None
    return evals, agents, (dataset, baseline)


def _print(result: EvalResult, baseline: Any, out: TextIO) -> None:
    from ..evals import compare

    width = 120 if not out.isatty() else None
    out.write(result.report.render(width=width, baseline=baseline))
    out.write(result.summary_line() + "\n")
    if baseline is not None:
        for line in compare(result, baseline).lines():
            out.write(line + "\n")


def eval_command(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``trio-agents eval``; return the exit status."""
    evals, agents, (dataset, baseline) = _load(args)
    limits = None
    if args.deadline is not None:
        from .._limits import UsageLimits

        limits = UsageLimits(deadline=args.deadline)
    evaluation = evals.Evaluation(
        dataset,
        agents,
        max_concurrency=args.concurrency,
        limits=limits,
        on_case=_progress(sys.stderr),
    )
    interrupted = trio.run(_run, evaluation, sys.stderr)
    result = evaluation.result()
    if args.json is not None:
        try:
            result.write_json(args.json)
        except OSError as exc:
            raise CLIError(f"--json {args.json}: {exc}") from None
    _print(result, baseline, out)
    out.flush()
    if interrupted:
        print("trio-agents: interrupted; the partial result is above", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.threshold is not None and result.score < args.threshold:
        print(
            f"trio-agents: score {result.score:.1%} is below the threshold {args.threshold:.1%}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return 0
