"""Commands for agents a user names and runs: ``agents register|list|show``, ``run AGENT``, and ``runs``
(the runs the planner keeps, filtered and newest first). docs/agents.md describes them."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from loopwarden.cli_common import (
    FAILED,
    OK,
    USAGE,
    UserError,
    add_json_flag,
    add_priority_flag,
    connected,
    emit_json,
    load_scenario_file,
    plain,
    say,
    settings,
)

if TYPE_CHECKING:
    from shared.messages import RunSnapshot

STATUSES = ("running", "awaiting_human", "stalled", "completed", "stopped", "failed", "refused")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> timedelta:
    """``90``, ``90s``, ``5m``, ``1h``, ``2d`` (the console's syntax)."""
    m = _DURATION.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (write 90s, 5m, 1h or 2d)")
    return timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "agents",
        help="register, list and show agents (a definition every run of it gets)",
        description="Agents: instructions, model, tools, rubric, limits and policies under a name, run with "
        "`loopwarden run NAME`. Registering needs an operator's or the admin's NATS user (LW_NATS_USER): an "
        "agent is what every tenant's runs of it do, so clients only read them.",
    )
    actions = p.add_subparsers(dest="agents_action", metavar="ACTION", required=True)
    q = actions.add_parser(
        "register",
        help="register (or update) an agent from a YAML or JSON file",
        description="Store the agent under its name: version 1, or the next version when the file changed it "
        "(the same version when it did not). schemas/agent.json is the file's JSON Schema.",
    )
    q.add_argument("file", metavar="FILE", help="the agent file (.yaml, .yml or .json)")
    add_json_flag(q)
    q.set_defaults(func=cmd_register)
    q = actions.add_parser("list", help="the registered agents", description="Every registered agent, by name.")
    add_json_flag(q)
    q.set_defaults(func=cmd_list)
    q = actions.add_parser("show", help="one agent's definition", description="An agent's definition and version.")
    q.add_argument("name", metavar="NAME", help="the agent's name")
    add_json_flag(q)
    q.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "run",
        help="run a registered agent on a task (live) or a scenario (scripted)",
        description="Start a run of the agent and print its id. With --wait, wait until it ends or waits for a "
        "human and print how it ended (exit 0 completed or, with a scenario's expect, ended as expected; 1 failed, "
        "stopped or not as expected; 5 waiting for a human). A scenario calling tools the stack does not host is "
        "refused first; a submit refused at the door (a quota, the daily ceiling) prints why, exit 1.",
    )
    p.add_argument("agent", metavar="AGENT", help="the agent's name (`loopwarden agents list`)")
    p.add_argument("--task", metavar="TEXT", help="the task (a live run, by the planner's provider)")
    p.add_argument("--scenario", metavar="FILE", help="a scenario: the run is scripted by it (its task, unless --task)")
    add_priority_flag(p)
    p.add_argument("--wait", action="store_true", help="wait until the run ends or waits for a human")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds --wait waits (default: 120)")
    p.add_argument(
        "--allow-missing-tools",
        action="store_true",
        help="submit a scenario calling tools the running stack does not host (each call: an unknown_tool failure)",
    )
    add_json_flag(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "runs",
        help="list runs by status, agent, tenant and age, newest first",
        description="The runs the planner keeps, newest first: one line each (--json: a JSON list).",
    )
    p.add_argument("--status", choices=STATUSES, help="only runs in this status")
    p.add_argument("--agent", metavar="NAME", help="only runs of this agent")
    p.add_argument("--tenant", metavar="NAME", help="only runs of this tenant")
    p.add_argument("--since", type=duration, metavar="AGE", help="only runs started at most AGE ago (90s, 5m, 1h, 2d)")
    p.add_argument("--limit", type=int, default=20, metavar="N", help="at most N runs (default: 20)")
    p.add_argument("--offset", type=int, default=0, metavar="N", help="skip the N newest matches (the next page)")
    add_json_flag(p)
    p.set_defaults(func=cmd_runs)


def _agent_json(record: Any) -> dict[str, Any]:
    return {
        "name": record.agent.name,
        "version": record.version,
        "digest": record.digest,
        "registered_at": record.registered_at.isoformat(),
        "registered_by": record.registered_by,
        "definition": record.agent.model_dump(mode="json", exclude_defaults=True),
    }


def _connected_as_user() -> Any:
    return connected(settings())  # as LW_NATS_USER: registering takes an operator's or the admin's user


async def cmd_register(args: argparse.Namespace) -> int:
    from loopwarden.client import NotAllowed, UnreadableAgent
    from shared.agents import AgentError, load_agent

    try:
        agent = load_agent(args.file)  # before connecting
    except AgentError as err:
        raise UserError(str(err), USAGE) from None
    async with _connected_as_user() as client:
        try:
            before = await client.agent(agent.name)
        except UnreadableAgent:
            before = None  # registering over it is the roster's decision (the escalation service's)
        try:
            record = await client.register(agent)
        except NotAllowed as err:
            raise UserError(str(err), FAILED) from None
    if args.json:
        emit_json(_agent_json(record))
    elif before is not None and before.version == record.version:
        say(f"agent {record.agent.name} unchanged (version {record.version})")
    else:
        say(f"registered agent {record.agent.name} version {record.version}")
    return OK


async def cmd_list(args: argparse.Namespace) -> int:
    async with _connected_as_user() as client:
        records = await client.agents()
    for key, why in records.unreadable.items():  # named, never hiding the others
        say(plain(f"lw_agents/{key}: stored but unreadable, not listed ({why})"), err=True)
    if args.json:
        emit_json([_agent_json(r) for r in records])
        return OK
    if not records:
        say("no agents registered (`loopwarden agents register FILE`)")
    for r in records:
        a = r.agent
        tools = ", ".join(a.tools) if a.tools is not None else "every tool"
        say(plain(f"{a.name}  v{r.version}  model {a.model or '(the stack default)'}  tools: {tools}"))
        if a.description:
            say(plain(f"    {a.description}"))
    return OK


async def cmd_show(args: argparse.Namespace) -> int:
    import yaml

    from loopwarden.client import UnreadableAgent

    async with _connected_as_user() as client:
        try:
            record = await client.agent(args.name)
        except UnreadableAgent as err:
            raise UserError(str(err), FAILED) from None
    if record is None:
        raise UserError(f"no agent {args.name!r} (`loopwarden agents list` shows those registered)", FAILED)
    if args.json:
        emit_json(_agent_json(record))
        return OK
    by = f" by {record.registered_by}" if record.registered_by else ""
    say(f"# {record.agent.name} version {record.version}, registered {record.registered_at:%Y-%m-%d %H:%M:%S}Z{by}")
    say(plain(yaml.safe_dump(record.agent.model_dump(mode="json", exclude_defaults=True), sort_keys=False).rstrip()))
    return OK


async def cmd_run(args: argparse.Namespace) -> int:
    """As ``submit`` (the missing-tools refusal, ``expect``, the exit codes), for a registered agent."""
    from loopwarden.cli_runs import refuse_missing_tools, report_run
    from loopwarden.client import UnknownAgent

    if args.task is None and args.scenario is None:
        raise UserError("run: give --task TEXT (a live run) or --scenario FILE (a scripted run)")
    scenario = load_scenario_file(args.scenario) if args.scenario else None  # before connecting
    async with connected() as client:
        await refuse_missing_tools(client, scenario, args)
        try:
            run_id = await client.submit_agent(args.agent, args.task, scenario=scenario, priority=args.priority)
        except UnknownAgent as err:
            raise UserError(str(err), FAILED) from None
        return await report_run(client, run_id, scenario, args, _cost_and_agent)


def _cost_and_agent(state: RunSnapshot) -> str:
    return f"cost ${state.usage.cost_usd:.4f} · agent {state.agent} v{state.agent_version}"


async def cmd_runs(args: argparse.Namespace) -> int:
    if args.limit < 1 or args.offset < 0:
        raise UserError("runs: --limit is at least 1 and --offset at least 0")
    async with connected() as client:
        runs = await client.runs(
            status=args.status,
            agent=args.agent,
            tenant=args.tenant,
            since=args.since,
            limit=args.limit,
            offset=args.offset,
        )
    if args.json:
        emit_json(
            [
                {
                    "run_id": r.run_id,
                    "status": r.status,
                    "agent": r.agent,
                    "agent_version": r.agent_version,
                    "tenant": r.tenant,
                    "priority": r.priority,
                    "created_at": r.created_at.isoformat(),
                    "updated_at": r.updated_at.isoformat(),
                    "cost_usd": r.usage.cost_usd,
                    "reason": r.final_reason,
                    "task": r.task,
                }
                for r in runs
            ]
        )
        return OK
    if not runs:
        say("no runs match")
    for r in runs:
        agent = f"{r.agent} v{r.agent_version}" if r.agent else "-"
        task = " ".join(r.task.split())
        task = task if len(task) <= 60 else task[:59] + "…"
        say(
            plain(
                f"{r.run_id}  {r.created_at:%Y-%m-%d %H:%M:%S}  {r.status:<14} {agent:<16} "
                f"{r.tenant or '-':<10} p{r.priority} ${r.usage.cost_usd:.4f}  {task}"
            )
        )
    return OK
