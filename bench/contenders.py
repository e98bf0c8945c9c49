"""Side by side (issue 36): the same agent loop in other frameworks, measured in the same invocation as
Loopwarden, in interleaved rounds. A step is one model turn that calls one tool, the tool's output
validated, with an instant scripted model and tool; ms per step = a run's wall time (start to final
answer) / its steps, and at 16 runs at once the wall time of all / their steps.

- **PydanticAI in one process** (``FunctionModel``, the tool's output a pydantic model): nothing durable,
  no process boundary - the floor a durable loop is held against;
- **LangGraph + SQLite checkpointer** (``SqliteSaver``, WAL with ``synchronous=FULL``: every checkpoint
  fsynced, as LangGraph ships it): durable in one process.

Both are an optional extra (``pip install -e '.[bench]'``; ``make bench`` installs it, ``make test`` never
does). Without them the side-by-side says so and the floor is Loopwarden's own in-process loop
(``bench.throughput.floor_steps``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench import bus_floor

Contender = Callable[[int, int], Awaitable[float]]
"""(runs at once, steps per run) -> ms per step."""


class Sum(BaseModel):
    """The calculator's output contract (validated on every call)."""

    expression: str
    result: int


def calculate(expression: str) -> Sum:
    return Sum.model_validate({"expression": expression, "result": sum(int(t) for t in expression.split("+"))})


def available() -> list[str]:
    """The contenders whose packages are installed."""
    found = []
    if importlib.util.find_spec("pydantic_ai") is not None:
        found.append("pydanticai")
    if importlib.util.find_spec("langgraph") is not None and importlib.util.find_spec("langgraph.checkpoint.sqlite"):
        found.append("langgraph")
    return found


# --- PydanticAI, one process ---------------------------------------------------------------------------
async def pydanticai(runs: int, steps: int) -> float:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    seed = uuid.uuid4().int % 10_000

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(1 for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart))
        if done < steps:
            return ModelResponse(parts=[ToolCallPart("calculator", {"expression": f"{done}+{seed}"}, f"c{done}")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), instructions="Add the numbers one by one, then say done.")

    @agent.tool_plain
    def calculator(expression: str) -> Sum:
        return calculate(expression)

    t0 = time.perf_counter()
    results = await asyncio.gather(*(agent.run("Add the numbers one by one, then say done.") for _ in range(runs)))
    wall = time.perf_counter() - t0
    assert all(r.output == "done" for r in results)
    return wall / (runs * steps) * 1000


# --- LangGraph + SQLite checkpointer -------------------------------------------------------------------
def _langgraph_app(path: Path, steps: int) -> Any:
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # WAL
    conn.execute("PRAGMA synchronous=FULL")  # every commit fsynced (SQLite's default in WAL: said, not assumed)
    seed = uuid.uuid4().int % 10_000

    def model(state: dict[str, Any]) -> dict[str, Any]:
        done = sum(1 for m in state["messages"] if isinstance(m, ToolMessage))
        if done < steps:
            call = {"name": "calculator", "args": {"expression": f"{done}+{seed}"}, "id": f"c{done}"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        return {"messages": [AIMessage(content="done")]}

    def tools(state: dict[str, Any]) -> dict[str, Any]:
        last = state["messages"][-1]
        out = []
        for call in getattr(last, "tool_calls", []):
            result = calculate(str(call["args"]["expression"]))
            out.append(ToolMessage(content=result.model_dump_json(), tool_call_id=call["id"]))
        return {"messages": out}

    def route(state: dict[str, Any]) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=saver), conn


async def langgraph(runs: int, steps: int) -> float:
    from langchain_core.messages import HumanMessage

    path = Path(tempfile.mkdtemp(prefix="lw-bench-lg-")) / "checkpoints.sqlite"
    app, conn = _langgraph_app(path, steps)
    limit = {"recursion_limit": 2 * steps + 10}

    def one() -> str:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}, **limit}
        out = app.invoke({"messages": [HumanMessage("Add the numbers one by one, then say done.")]}, config)
        return str(out["messages"][-1].content)

    try:
        t0 = time.perf_counter()
        # the sync saver serializes on its connection's lock: 16 runs at once share it, as threads would
        answers = await asyncio.gather(*(asyncio.to_thread(one) for _ in range(runs)))
        wall = time.perf_counter() - t0
    finally:
        conn.close()
    assert all(a == "done" for a in answers)
    return wall / (runs * steps) * 1000


CONTENDERS: dict[str, tuple[str, Contender]] = {
    "pydanticai": ("PydanticAI in one process (not durable: the floor)", pydanticai),
    "langgraph": ("LangGraph + SQLite checkpointer (fsync)", langgraph),
}
SHAPES = ((1, 10), (1, 40), (16, 10))  # (runs at once, steps per run)


async def measure(
    loopwarden: Contender, rounds: int, extra: dict[str, Contender] | None = None
) -> dict[str, dict[tuple[int, int], float]]:
    """Median ms per step of every contender at every shape, over ``rounds`` interleaved rounds (each round
    runs every contender once per shape, the order rotated); ``extra``: more contenders, by name (the bus's
    floor, ``bench.bus_floor``)."""
    fns: dict[str, Contender] = {
        "loopwarden": loopwarden,
        **{n: CONTENDERS[n][1] for n in available()},
        **(extra or {}),
    }
    names = list(fns)
    for n in names:  # warm-up: imports, first connections
        await fns[n](1, 3)
    seen: dict[str, dict[tuple[int, int], list[float]]] = {n: {s: [] for s in SHAPES} for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for shape in SHAPES:
            for n in order:
                seen[n][shape].append(await fns[n](*shape))
    return {n: {s: statistics.median(v) for s, v in by.items()} for n, by in seen.items()}


def label(name: str) -> str:
    if name == "loopwarden":
        return "Loopwarden (one replica each)"
    return CONTENDERS[name][0] if name in CONTENDERS else bus_floor.SHAPES[name][0]
