"""Demo tools hosted by the executor: real implementations over bundled data.

Contracts for ``search``, ``submit_result`` and ``exchange_rate`` are JSON files in
``schemas/tools/``; the others are declared here with ``@tool``. Both go through the same
registration checks.
"""

from __future__ import annotations

import ast
import json
import operator
import re
import sqlite3
import uuid
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from shared.messages import RetryPolicy
from shared.subjects import KV_DEMO
from shared.tools import ToolContext, ToolFailure, tool

DATA = Path(__file__).resolve().parent


# --- search (contract: schemas/tools/search.json) --------------------------------------------


@lru_cache(maxsize=1)
def corpus() -> list[dict[str, str]]:
    return json.loads((DATA / "corpus.json").read_text())  # type: ignore[no-any-return]


_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) > 2}


async def search(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    query = _words(args["query"])
    scored = []
    for doc in corpus():
        overlap = len(query & _words(doc["title"] + " " + doc["text"]))
        if overlap:
            scored.append((overlap, doc))
    scored.sort(key=lambda pair: -pair[0])
    hits = [d for _, d in scored[: args.get("maxResults", 3)]]
    if not hits:
        return {"status": "not_found", "reason": f"no document mentions {args['query']!r}"}
    return {
        "status": "success",
        "results": [{"title": d["title"], "url": d["url"], "snippet": d["text"][:300]} for d in hits],
        "totalCount": len(scored),
    }


# --- submit_result (contract: schemas/tools/submit_result.json) ------------------------------


async def submit_result(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {
        "status": "submitted",
        "submission_id": f"sub_{ctx.run_id[-12:]}_{ctx.call_id[-8:]}",
        "received_chars": len(args["answer"]),
    }


# --- exchange_rate (contract: schemas/tools/exchange_rate.json) ------------------------------

RATES_TO_USD = {"usd": 1.0, "eur": 1.08, "krw": 0.00072, "jpy": 0.0066, "gbp": 1.27}


async def exchange_rate(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    base, quote = args["base"], args["quote"]
    return {
        "base": base,
        "quote": quote,
        "rate": round(RATES_TO_USD[base] / RATES_TO_USD[quote], 6),
        "as_of": "2026-11-30T00:00:00Z",
    }


def normalize_rate(output: Any) -> Any:
    """Post-call hook: the rate service sometimes sends the rate as a string; round it to 6 places."""
    if isinstance(output, dict) and isinstance(output.get("rate"), str | int | float):
        try:
            return {**output, "rate": round(float(output["rate"]), 6)}
        except ValueError:
            return output  # leave it: output validation will say what is wrong
    return output


# --- calculator --------------------------------------------------------------------------------

_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError("only numbers and + - * / % ** ( ) are allowed")


@tool(
    name="calculator",
    description="Evaluate an arithmetic expression with + - * / % ** and parentheses. Use it for any arithmetic "
    "instead of computing in your head.",
    input_schema={
        "type": "object",
        "properties": {
            "expression": {
                "type": "string",
                "minLength": 1,
                "maxLength": 200,
                "pattern": r"^[0-9+\-*/%().\s]+$",
                "description": "e.g. '2 * 60' or '(3 + 4) / 7'",
            }
        },
        "required": ["expression"],
    },
    output_schema={
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "status": {"const": "ok"},
                    "expression": {"type": "string"},
                    "result": {"type": "number"},
                },
                "required": ["status", "expression", "result"],
            },
            {
                "type": "object",
                "properties": {"status": {"const": "error"}, "reason": {"type": "string"}},
                "required": ["status", "reason"],
            },
        ]
    },
    idempotent=True,
    timeout_s=2.0,
)
async def calculator(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    expr = args["expression"]
    try:
        value = _eval(ast.parse(expr, mode="eval"))
    except ZeroDivisionError:
        return {"status": "error", "reason": "division by zero"}
    except (ValueError, SyntaxError) as err:
        return {"status": "error", "reason": f"cannot evaluate {expr!r}: {err}"}
    return {"status": "ok", "expression": expr, "result": value}


# --- charge_card: not idempotent -------------------------------------------------------------


@tool(
    name="charge_card",
    description="Charge a customer's saved card. NOT idempotent: every successful call moves money. Never call it "
    "twice for the same purchase.",
    input_schema={
        "type": "object",
        "properties": {
            "customer_id": {"type": "string", "pattern": "^cus_[a-z0-9]{4,32}$", "description": "e.g. cus_4f2a9"},
            "amount_cents": {
                "type": "integer",
                "minimum": 1,
                "maximum": 1_000_000,
                "description": "amount in the currency's minor unit",
            },
            "currency": {"type": "string", "enum": ["usd", "eur", "krw"], "description": "ISO code, lower case"},
        },
        "required": ["customer_id", "amount_cents", "currency"],
    },
    output_schema={
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "status": {"const": "charged"},
                    "charge_id": {"type": "string"},
                    "amount_cents": {"type": "integer"},
                },
                "required": ["status", "charge_id", "amount_cents"],
            },
            {
                "type": "object",
                "properties": {"status": {"const": "declined"}, "reason": {"type": "string"}},
                "required": ["status", "reason"],
            },
        ]
    },
    idempotent=False,
    timeout_s=30.0,
    retry=RetryPolicy(max_attempts=1),
    boundary="ask_human",
)
async def charge_card(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    charge_id = f"ch_{uuid.uuid4().hex[:16]}"
    ledger = await ctx.bucket(KV_DEMO)  # the side effect the idempotency ledger protects
    if ledger is not None:
        await ledger.put(f"charge.{ctx.run_id}.{charge_id}", json.dumps({"call_id": ctx.call_id, **args}).encode())
    return {"status": "charged", "charge_id": charge_id, "amount_cents": args["amount_cents"]}


# --- sql_query with a read-only cache fallback ------------------------------------------------

ORDERS = [
    (1001, "cus_ada1", "shipped", 4200),
    (1002, "cus_bob2", "pending", 1599),
    (1003, "cus_ada1", "delivered", 899),
    (1004, "cus_cyd3", "cancelled", 2500),
]
_SELECT = r"^\s*select\s[^;]*$"


@lru_cache(maxsize=1)
def _db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.execute("create table orders (id integer primary key, customer_id text, status text, total_cents integer)")
    db.executemany("insert into orders values (?, ?, ?, ?)", ORDERS)
    return db


_ROWS_SCHEMA = {
    "type": "object",
    "properties": {
        "rows": {
            "type": "array",
            "items": {"type": "object", "x-loopwarden-open": True, "description": "one row, column -> value"},
        },
        "rowCount": {"type": "integer", "minimum": 0},
        "source": {"type": "string", "enum": ["live", "snapshot"]},
    },
    "required": ["rows", "rowCount", "source"],
}
_SQL_INPUT = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "pattern": _SELECT,
            "description": "one read-only SELECT over table orders(id, customer_id, status, total_cents)",
        }
    },
    "required": ["query"],
}


@tool(
    name="sql_query",
    description="Run one read-only SELECT against the live orders database.",
    input_schema=_SQL_INPUT,
    output_schema=_ROWS_SCHEMA,
    idempotent=True,
    timeout_s=5.0,
    retry=RetryPolicy(max_attempts=3, base_delay_s=0.05, max_delay_s=0.5, max_elapsed_s=5.0),
    fallback="readonly_cache",
)
async def sql_query(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    try:
        cur = _db().execute(args["query"])
    except sqlite3.Error as err:
        raise ToolFailure("fatal", f"the database rejected the query: {err}. Fix the SQL and try again.") from err
    names = [d[0] for d in cur.description or []]
    rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return {"rows": rows, "rowCount": len(rows), "source": "live"}


@tool(
    name="readonly_cache",
    description="Answer a SELECT from last night's read-only snapshot of the orders "
    "database (may be up to a day stale).",
    input_schema=_SQL_INPUT,
    output_schema=_ROWS_SCHEMA,
    idempotent=True,
    timeout_s=5.0,
)
async def readonly_cache(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    result = await sql_query(args, ctx)
    return {**result, "source": "snapshot"}


# --- enrich_company: optional data, skipped with a note when down ----------------------------

COMPANIES = {
    "acme": {"employees": 420, "founded": 1999, "hq": "Seoul"},
    "globex": {"employees": 12000, "founded": 1989, "hq": "Springfield"},
}


@tool(
    name="enrich_company",
    description="Optional enrichment: size, founding year and HQ of a company. If it "
    "is unavailable, continue without it.",
    input_schema={
        "type": "object",
        "properties": {"company": {"type": "string", "minLength": 2, "description": "company name"}},
        "required": ["company"],
    },
    output_schema={
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "status": {"const": "found"},
                    "company": {"type": "string"},
                    "employees": {"type": "integer"},
                    "founded": {"type": "integer"},
                    "hq": {"type": "string"},
                },
                "required": ["status", "company", "employees", "founded", "hq"],
            },
            {
                "type": "object",
                "properties": {"status": {"const": "not_found"}, "reason": {"type": "string"}},
                "required": ["status", "reason"],
            },
        ]
    },
    idempotent=True,
    timeout_s=3.0,
    boundary="skip_and_note",
    group="enrichment",
    retry=RetryPolicy(max_attempts=2, base_delay_s=0.05, max_delay_s=0.2, max_elapsed_s=2.0),
)
async def enrich_company(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    found = COMPANIES.get(args["company"].strip().lower())
    if found is None:
        return {"status": "not_found", "reason": f"no record for {args['company']!r}"}
    return {"status": "found", "company": args["company"], **found}
