"""`make bench` / `python -m bench [--quick] [--only validation|e2e|chaos]`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from bench import chaos, e2e, guard, throughput, validation


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("--quick", action="store_true", help="short measurements (used by the test suite)")
    parser.add_argument(
        "--only",
        choices=[
            "validation",
            "e2e",
            "throughput",
            "step",
            "durability",
            "chaos",
            "mcp",
            "storage",
            "cost",
            "fairness",
            "overload",
            "ratelimit",
        ],
    )
    parser.add_argument(
        "--before", action="store_true", help="ratelimit: also run with LW_RATE_LIMIT_FLEET=false, for comparison"
    )
    parser.add_argument("--profile", metavar="DIR", help="with --only step: py-spy the services, stacks kept in DIR")
    parser.add_argument(
        "--profile-runs",
        type=int,
        default=16,
        metavar="N",
        help="with --profile: runs at once while profiled (default 16; 1: what a lone run's step costs)",
    )
    args = parser.parse_args()
    measured: dict[str, float] = {}  # the headline figures, for the regression guard (bench/guard.py)
    if args.only in (None, "validation"):
        print("\n".join(validation.report(validation.run(seconds=0.3 if args.quick else 2.0))), flush=True)
    if args.only in (None, "e2e"):
        print("\n".join(e2e.report(e2e.run(n=4 if args.quick else 20))), flush=True)
    if args.only in (None, "mcp"):  # MCP per-call cost (issue 14)
        from bench import mcp

        client = asyncio.run(mcp.client_side(50 if args.quick else 300))
        loop = mcp.loop(calls=5 if args.quick else 10, runs=2 if args.quick else 5)
        print("\n".join(mcp.report(client, loop)), flush=True)
    if args.only in (None, "throughput"):
        result_t = throughput.run(quick=args.quick)
        print("\n".join(throughput.report(result_t)), flush=True)
        measured.update(guard.from_throughput(result_t))
    if args.only in (None, "step"):  # what a step costs, counted by service and kind (issue 36)
        from bench import step

        if args.profile_runs < 1:
            parser.error(f"--profile-runs must be at least 1 (got {args.profile_runs})")
        profile_dir = Path(args.profile) if args.profile else None
        result_s = step.run(quick=args.quick, profile_dir=profile_dir, profile_runs=args.profile_runs)
        print("\n".join(step.report(result_s)), flush=True)
        measured.update(guard.from_step(result_s))
    if args.only in (None, "durability"):  # a step with JetStream's fsync on every write vs the default (issue 28)
        from bench import durability

        print("\n".join(durability.report(durability.run(quick=args.quick))), flush=True)
    if args.only in (None, "storage"):  # bytes per run, retention, soak (issue 15)
        from bench import storage

        if args.quick:  # the smoke in tests/own/test_bench_smoke.py: one stack, swept after each batch
            print("\n".join(storage.report(storage.run(runs=40, batch=20, sweep=True))), flush=True)
        else:
            kept = storage.run(runs=1000, batch=50)
            print("\n".join(storage.report(kept)), flush=True)
            measured["stored_bytes"] = sum(b for b, _ in kept.per_run.values())
            print("\n".join(storage.report(storage.run(runs=storage.soak_runs(), batch=50, sweep=True))), flush=True)
    if args.only in (None, "cost"):  # cost as the bill says it (issue 11)
        from bench import cost

        print("\n".join(cost.report(cost.run(steps=24 if args.quick else 80))), flush=True)
    if args.only in (None, "ratelimit"):  # the provider's rate limit, fleet-wide (issue 34)
        from bench import ratelimit

        limited = ratelimit.run(runs=20 if args.quick else 200)
        print("\n".join(ratelimit.report(limited)), flush=True)
        if args.before:
            print("\n".join(ratelimit.report(ratelimit.run(runs=20 if args.quick else 200, fleet=False))), flush=True)
    ok = True
    if args.only in (None, "fairness"):  # fair share between tenants (issue 34)
        from bench import fairness

        fair = fairness.run(burst=200, small=10) if args.quick else fairness.run()
        print("\n".join(fairness.report(fair)), flush=True)
    if args.only in (None, "overload"):  # far more runs than the fleet serves, in one burst (issue 34)
        from bench import overload

        over = overload.run(n=1000, quota=150) if args.quick else overload.run()
        print("\n".join(overload.report(over)), flush=True)
        ok = ok and not over["lost"] and not over["unanswered"]
    if args.only in (None, "chaos"):
        result = chaos.run(runs=12, kills=8) if args.quick else chaos.run()
        print("\n".join(chaos.report(result)), flush=True)
        ok = ok and result.ok
    if measured:
        print("\n".join(guard.report(measured)), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
