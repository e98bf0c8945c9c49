"""Commands for the operators who work the human queue: ``escalations list|show|claim|renew|resolve``.

An operator's NATS user may publish only its own subjects and read only its own inbox, so the
client connects as ``LW_NATS_USER`` and acts as that operator unless ``--as`` names another."""

from __future__ import annotations

import argparse
import os
from typing import Any

from loopwarden.cli_common import (
    FAILED,
    OK,
    UserError,
    add_json_flag,
    connected,
    emit_json,
    json_arg,
    plain,
    say,
    settings,
)
from shared.escalation_actions import ACTIONS, KINDS, withheld

_NEEDS_FLAG = {"json": "--result", "text": "--answer", "note": "--note"}


def _action_help() -> str:
    """The decision, each action with what it must carry (the queue's action table)."""
    parts = [
        f"{name} ({spec.meaning}{'; needs ' + _NEEDS_FLAG[spec.needs] if spec.needs != 'nothing' else ''})"
        for name, spec in ACTIONS.items()
    ]
    return "the decision: " + "; ".join(parts)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "escalations",
        help="the human queue: list, show, claim, renew, resolve",
        description="Work the durable human queue. Claims are leases: renew them, or they return to the queue.",
    )
    esc = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = esc.add_parser("list", help="items by state, kind, tool, run and age", description="Queue items, filtered.")
    q.add_argument(
        "--status",
        "--state",
        default="open",
        choices=["open", "claimed", "resolved", "all"],
        help="which items (default: open)",
    )
    q.add_argument("--kind", help=f"only this kind ({', '.join(KINDS)})")
    q.add_argument("--tool", help="only items about this tool")
    q.add_argument("--run", metavar="RUN", help="only this run's items")
    q.add_argument("--older-than", type=float, metavar="SECONDS", help="raised at least this long ago")
    q.add_argument("--newer-than", type=float, metavar="SECONDS", help="raised at most this long ago")
    add_json_flag(q)
    q = esc.add_parser(
        "show",
        help="one item whole: context, arguments, allowed actions, trail",
        description="One item as the console shows it (--json: as JSON).",
    )
    q.add_argument("id", metavar="ID", help="the escalation id")
    add_json_flag(q)
    who_help = "the operator (default: LW_NATS_USER, else $USER); the server enforces it with per-operator users"
    for verb, text in (("claim", "take an item under a lease"), ("renew", "extend your lease on an item")):
        q = esc.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ".")
        q.add_argument("id", metavar="ID", help="the escalation id")
        q.add_argument("--as", "--who", dest="who", help=who_help)
        add_json_flag(q)
    q = esc.add_parser(
        "resolve",
        help="decide an item (what applies depends on its kind: `show` lists the allowed actions)",
        description="Resolve an item you claimed with one of the actions its kind allows.",
    )
    q.add_argument("id", metavar="ID", help="the escalation id")
    q.add_argument("--as", "--who", dest="who", help=who_help)
    q.add_argument("--action", dest="decision", required=True, choices=list(ACTIONS), help=_action_help())
    q.add_argument("--note", default="", help="the reason; for retry, the instruction for the model")
    q.add_argument("--result", metavar="JSON", help="JSON (or @file.json) used as the tool's result (provide_result)")
    q.add_argument("--answer", metavar="TEXT", help="the final answer's text (final_answer)")
    add_json_flag(q)
    p.set_defaults(func=cmd_escalations)


async def cmd_escalations(args: argparse.Namespace) -> int:
    from shared import subjects as S
    from shared.messages import ToolContract

    result: Any = None
    if args.action == "resolve":  # local input first: a bad --result never reaches the server
        result = json_arg(args.result, "--result") if args.result else None
        if ACTIONS[args.decision].needs == "text" and args.answer is not None:
            result = args.answer
    cfg = settings()
    who = getattr(args, "who", None) or cfg.nats_user or os.environ.get("USER", "operator")
    hidden, no_contract = 0, False
    async with connected(cfg) as client:
        if args.action == "list":
            reply = await client.escalations(
                args.status,
                args.run,
                kind=args.kind,
                tool=args.tool,
                older_than_s=args.older_than,
                newer_than_s=args.newer_than,
            )
            if args.status == "open" and not args.json and reply.ok:  # what the default leaves out, said once
                claimed = await client.escalations(
                    "claimed",
                    args.run,
                    kind=args.kind,
                    tool=args.tool,
                    older_than_s=args.older_than,
                    newer_than_s=args.newer_than,
                )
                hidden = len(claimed.escalations)
        elif args.action == "show":
            reply = await client.show(args.id)
            item = reply.escalations[0] if reply.ok and reply.escalations else None
            if item is not None and item.tool and withheld(item.allowed_actions, has_contract=False) and not args.json:
                contract, _ = await client.guard(client.bus.kv_get(S.KV_CONTRACTS, item.tool, ToolContract))
                no_contract = contract is None
        elif args.action == "claim":  # verbs the server lets only `who`'s own user publish: refused at once
            reply = await client.claim(args.id, who)
        elif args.action == "renew":
            reply = await client.renew(args.id, who)
        else:
            reply = await client.resolve(args.id, who, args.decision, args.note, result)
    if not reply.ok:
        if args.json:
            emit_json(reply.model_dump(mode="json"))
            return FAILED
        raise UserError(reply.error or "refused", FAILED)
    if args.json:
        emit_json(reply.model_dump(mode="json")["escalations"] if args.action != "show" else _one(reply))
        return OK
    if args.action == "show":  # the console's item page as text (JSON with --json)
        from loopwarden.runtext import escalation_lines

        for line in escalation_lines(reply.escalations[0], no_contract=no_contract):
            say(plain(line))
        return OK
    for item in reply.escalations:
        lease = f"  lease until {item.lease_expires_at:%H:%M:%S}" if item.lease_expires_at else ""
        holder = f" by {item.claimed_by}" if item.claimed_by else ""
        say(
            f"{item.escalation_id}  {item.status + holder:16}  {item.kind:15}  tool {item.tool or '-':14}  "
            f"run {item.run_id}  tenant {item.tenant or '-'}  {item.reason[:80]}{lease}"
        )
    for key in reply.unreadable:
        say(f"{key}  UNREADABLE (the record does not parse; `escalations show {key}` says why)", err=True)
    if hidden:
        items = "item is" if hidden == 1 else "items are"
        say(f"({hidden} claimed {items} not shown: `loopwarden escalations list --status claimed` lists them)")
    return OK


def _one(reply: Any) -> Any:
    return reply.escalations[0].model_dump(mode="json") if reply.escalations else None
