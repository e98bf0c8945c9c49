"""``loopwarden show RUN [--step STEP]`` and ``loopwarden events RUN --full``: the console's run view in the
terminal (``loopwarden.runtext``), read from the run's record (``loopwarden.records``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from loopwarden.cli_common import FAILED, OK, UserError, add_json_flag, connected, emit_json, plain, say

if TYPE_CHECKING:
    from loopwarden.runtree import Step
    from shared.records import RunRecord


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "show",
        help="a run as a tree of timed steps, or one step whole (--step)",
        description="The run's steps (iterations, model turns, tool calls and their attempts, validation, judge, "
        "Decide rows, escalations) with durations, tokens, cost and status; --step prints one step whole: an "
        "iteration number (3) prints every step of that iteration, a step id (i1.tool.toolu_001_01) that step.",
    )
    p.add_argument("run_id", metavar="RUN", help="the run id")
    p.add_argument("--step", metavar="STEP", help="an iteration number or a step id (as `show RUN` prints them)")
    add_json_flag(p)
    p.set_defaults(func=cmd_show)


async def _record(run_id: str) -> RunRecord:
    from loopwarden.records import RecordNotFound

    async with connected() as client:
        try:
            return await client.export(run_id)
        except RecordNotFound as err:
            raise UserError(str(err), FAILED) from None


def lines_of(record: RunRecord, step: str | None = None, full: bool = False) -> list[str]:
    """What ``show`` (and ``events --full``) print: the tree, then the chosen steps whole."""
    from loopwarden import runtree as T
    from loopwarden.runtext import step_lines, tree_lines

    tree = T.build(record)
    if step is None and not full:
        return tree_lines(tree)
    if step is None:
        chosen = [s for _, s in tree.walk() if s.kind != "iteration"]
        out = tree_lines(tree)
    else:
        wanted = f"i{step}" if step.isdigit() else step
        top = tree.find(wanted)
        if top is None:
            known = ", ".join(s.id for s in tree.steps)
            raise UserError(f"run {record.run_id} has no step {step!r} (iterations: {known})", FAILED)
        chosen = [top] if top.kind != "iteration" else [s for s in _under(top)]
        out = []
    for s in chosen:
        out += ["", *step_lines(s, T.step_detail(record, s.id))]
    return out


def _under(step: Step) -> list[Step]:
    return [c for child in step.children for c in (child, *_under(child))]


async def cmd_show(args: argparse.Namespace) -> int:
    from loopwarden import runtree as T

    record = await _record(args.run_id)
    if args.json:
        tree = T.build(record)
        if args.step:
            wanted = f"i{args.step}" if args.step.isdigit() else args.step
            emit_json([{"key": s.key, "title": s.title, "body": s.body} for s in T.step_detail(record, wanted)])
        else:
            emit_json([{"depth": d, **{k: getattr(s, k) for k in _FIELDS}} for d, s in tree.walk()])
        return OK
    for line in lines_of(record, args.step):
        say(plain(line))
    return OK


async def cmd_events_full(args: argparse.Namespace) -> int:
    for line in lines_of(await _record(args.run_id), full=True):
        say(plain(line))
    return OK


_FIELDS = ("id", "kind", "title", "status", "start_s", "end_s", "summary", "input_tokens", "output_tokens", "cost_usd")
