"""Typed tools as plain functions: contracts from signatures, the runner, per-run state without a
bus, tool modules by setting and entry point, and the fake model's default agent."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field, field_validator

from loopwarden.fake_model import FakeModel, default_reply, example_of, judge_scores, load_script
from services.executor.registry import ToolRegistry
from services.executor.tool_modules import import_tool_modules
from shared.contracts.lint import lint_contract
from shared.tools import SignatureError, ToolContext, ToolFailure, declaration_of, declared_in, signature_of, tool
from tests.support.timing import bound

ROOT = Path(__file__).resolve().parents[2]


class Order(BaseModel):
    sku: str = Field(description="the item")
    units: int = Field(ge=1, description="how many")

    @field_validator("sku")
    @classmethod
    def known(cls, value: str) -> str:
        if value == "NOPE-1":
            raise ValueError("no such item")
        return value


@pytest.fixture(autouse=True)
def imported_here_stay_here() -> Iterator[None]:
    """A tool module these tests import by path is forgotten after them."""
    modules = set(sys.modules)
    yield
    for name in set(sys.modules) - modules:
        if name == "ep_tools":
            del sys.modules[name]


def registered(fn: Any) -> Any:
    declared = declaration_of(fn)
    assert declared is not None, f"{fn} carries no @tool declaration"
    registry = ToolRegistry()
    registry.load_declared([declared])
    assert not registry.refused, registry.refused
    return registry.tools[declared.contract.name]


def run(hosted: Any, args: dict[str, Any]) -> Any:
    return asyncio.run(hosted.fn(args, ToolContext(run_id="run-unit", call_id="c1", attempt=1)))


def test_a_model_parameter_generates_the_input_contract_and_its_validators_run() -> None:
    @tool
    async def order_one(order: Order, ctx: ToolContext) -> Order:
        """Order one item."""
        return order

    hosted = registered(order_one)
    assert hosted.contract.input_schema["required"] == ["sku", "units"]
    assert hosted.contract.input_schema["properties"]["units"]["minimum"] == 1
    assert hosted.text_result
    assert run(hosted, {"sku": "BOLT-M6", "units": 2}) == {"sku": "BOLT-M6", "units": 2}
    with pytest.raises(ToolFailure) as failed:
        run(hosted, {"sku": "NOPE-1", "units": 2})
    assert failed.value.kind == "tool_error" and "no such item" in str(failed.value)


def test_annotated_parameters_and_a_str_result() -> None:
    @tool(name="line", idempotent=True)
    def reorder(sku: Annotated[str, Field(description="the item")], units: int = 1) -> str:
        """Write one reorder line."""
        return f"{units} x {sku}"

    hosted = registered(reorder)
    schema = hosted.declared.input_schema
    assert schema["required"] == ["sku"] and schema["properties"]["units"]["default"] == 1
    assert hosted.contract.output_schema == {"type": "string"} and hosted.contract.idempotent
    assert run(hosted, {"sku": "BOLT-M6"}) == "1 x BOLT-M6"
    assert reorder("NUT-M6", 3) == "3 x NUT-M6"  # the function stays callable as written
    assert [str(i) for i in lint_contract(hosted.declared)] == [
        "line inputSchema #/properties/units: [no-description] 'units' has no description; the model reads it as "
        "instructions"
    ]


def test_a_tool_authors_import_loads_no_service() -> None:
    """``from loopwarden import tool`` is the author's API below every service, not the executor (issue 37)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from loopwarden import tool, ToolContext, ToolFailure, ToolState; "
            "print([m for m in sys.modules if m.startswith('services')])",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=bound(60),
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stdout + done.stderr


def test_the_executor_hosts_what_its_tool_modules_declare_and_nothing_declared_elsewhere(tmp_path: Path) -> None:
    """The declaration sits on the function: the executor reads it from the modules it loads, once each,
    and a tool declared anywhere else (here, in this test) is not hosted."""
    from services.executor.app import load_registry
    from shared.settings import Settings

    @tool
    def not_in_a_tool_module(text: str) -> str:
        """Echo, declared outside every tool module."""
        return text

    (tmp_path / "ep_tools.py").write_text(
        "from loopwarden import tool, ToolFailure\n\n"
        "@tool\ndef ep_echo(text: str) -> str:\n    'Echo.'\n    return text\n\n"
        "again = ep_echo  # the same function under a second name is one tool\n"
    )
    registry = load_registry(Settings(tool_modules=str(tmp_path / "ep_tools.py")))
    assert not registry.module_problems, registry.module_problems
    assert "ep_echo" in registry.tools and "not_in_a_tool_module" not in registry.tools
    assert {"calculator", "search"} <= set(registry.tools)  # the demo tools and the JSON contracts, as before
    assert declaration_of(not_in_a_tool_module) is not None and declaration_of(len) is None
    module = sys.modules["ep_tools"]
    assert [d.contract.name for d in declared_in([module, module])] == ["ep_echo"]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x: int):\n    'Doc.'\n", "annotate the return type"),
        ("def f(x) -> int:\n    'Doc.'\n", "annotate parameter 'x'"),
        ("def f(x: int) -> int:\n    pass\n", "give it a description"),
        ("def f(*xs: int) -> int:\n    'Doc.'\n", "must be a plain named parameter"),
    ],
)
def test_a_signature_that_cannot_make_a_contract_says_what_to_change(source: str, message: str) -> None:
    space: dict[str, Any] = {}
    exec(source, space)
    with pytest.raises(SignatureError, match=message):
        signature_of(space["f"], name=None, description=None, context_type=ToolContext)


def test_tool_state_without_a_bucket_is_per_run() -> None:
    async def go() -> tuple[Any, Any, Any]:
        a, b = ToolContext("run-a", "c", 1), ToolContext("run-b", "c", 1)
        await a.state.set("n", 1)
        await a.state.update("n", lambda n: n + 1)
        return await a.state.get("n"), await b.state.get("n", "unset"), await a.state.get("missing", [])

    assert asyncio.run(go()) == (2, "unset", [])


@pytest.mark.slow  # a `loopwarden lint` process
def test_tool_modules_by_path_by_name_and_by_entry_point(tmp_path: Path) -> None:
    (tmp_path / "ep_tools.py").write_text(
        "from loopwarden import tool\n\n@tool\ndef ep_echo(text: str) -> str:\n    'Echo.'\n    return text\n"
    )
    dist = tmp_path / "ep_tools-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-tools\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[loopwarden.tools]\nstock = ep_tools\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "LW_TOOL_MODULES": ""}
    env.pop("LW_MCP_SERVERS", None)
    done = subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", "lint"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=bound(120),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 refused" in done.stdout
    modules, problems = import_tool_modules(f"{tmp_path / 'ep_tools.py'},json, no_such_tools")
    assert [m.__name__ for m in modules] == ["ep_tools", "json"]
    assert [p.module for p in problems] == ["no_such_tools"]
    assert "set LW_TOOL_MODULES to the file's path" in str(problems[0])


def test_the_fake_models_default_agent_calls_each_tool_once_then_submits() -> None:
    tools = [
        {"name": "low_stock", "input_schema": {"type": "object", "properties": {"w": {"enum": ["north", "south"]}}}},
        {
            "name": "line",
            "input_schema": {
                "type": "object",
                "required": ["sku", "units"],
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]+-[0-9]+$", "examples": ["BOLT-6"]},
                    "units": {"type": "integer", "minimum": 5},
                },
            },
        },
        {"name": "submit_result", "input_schema": {"type": "object", "properties": {"answer": {"type": "string"}}}},
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Restock."}]
    seen = []
    for _ in range(3):
        block = default_reply({"tools": tools, "messages": messages})["content"][0]
        seen.append((block["name"], block["input"]))
        messages.append({"role": "assistant", "content": [block]})
    assert seen == [
        ("low_stock", {"w": "north"}),
        ("line", {"sku": "BOLT-6", "units": 5}),
        ("submit_result", {"answer": "Done. Called: low_stock, line."}),
    ]
    last = default_reply({"tools": tools, "messages": messages})["content"][0]
    assert last == {"type": "text", "text": "Done. Called: low_stock, line, submit_result."}
    root = {"$defs": {"A": {"type": "number", "maximum": 0.5}}}
    assert example_of({"$ref": "#/$defs/A"}, root) == 0.5


def test_the_fake_model_judges_every_criterion_and_reads_scripts(tmp_path: Path) -> None:
    prompt = "Task:\nx\n\nCandidate answer:\ny\n\nCriteria:\n- accurate: numbers right (required)\n- brief"
    assert judge_scores(prompt)["scores"] == {"accurate": 1.0, "brief": 1.0}
    script = tmp_path / "replies.yaml"
    script.write_text("- content: [{type: text, text: hi}]\n- {status: 429}\n")
    replies, keyed = load_script(str(script))
    model = FakeModel(script=replies)
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "q"}]}
        assert model.answer("/v1/messages", body, {})[2]["content"] == [{"type": "text", "text": "hi"}]
        assert model.answer("/v1/messages", body, {})[0] == 429
        assert model.answer("/v1/messages", body, {})[2]["content"][0]["type"] == "text"  # the default again
    finally:
        model.server.server_close()
    (tmp_path / "bad.json").write_text(json.dumps({"a": 1}))
    with pytest.raises(ValueError, match="expected a list of replies"):
        load_script(str(tmp_path / "bad.json"))
    assert keyed == {}
