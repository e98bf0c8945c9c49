"""Scripted scenarios: the offline stand-in for a model (and, optionally, for tools).

A scenario replays the planner's turns in order (one per model call), the judge's replies
in order (raw text allowed, so an unparseable reply can be scripted), compaction
summaries, and per-tool behaviour per execution attempt. It is validated on load; an error
names the file and the field (``planner[2].tool_calls[0].name: Field required``).
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from shared.describe import problems
from shared.failures import CALL_FAILURES, ScriptedFailure
from shared.messages import EscalationAction, Rubric, RunLimits

if TYPE_CHECKING:
    from shared.bus import Bus


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScriptedToolCall(_Strict):
    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ScriptedError(_Strict):
    type: Literal["rate_limit", "overloaded", "transient", "fatal"]
    message: str = "scripted provider error"
    retry_after_s: float | None = None


class ScriptedUsage(_Strict):
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)


class PlannerTurn(_Strict):
    text: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    error: ScriptedError | None = None
    usage: ScriptedUsage | None = Field(None, description="override the counted usage (e.g. a token-inflating turn)")
    latency_s: float = Field(0.0, ge=0, description="the model takes this long to answer")

    @model_validator(mode="after")
    def _unique_ids(self) -> PlannerTurn:
        ids = [c.id for c in self.tool_calls if c.id]
        if len(ids) != len(set(ids)):
            raise ValueError("tool call ids must be unique within a turn")
        return self

    @model_validator(mode="after")
    def _something(self) -> PlannerTurn:
        if self.error is None and self.text is None and not self.tool_calls:
            raise ValueError('a turn needs text, tool_calls or error (use text: "" for an empty turn)')
        return self


class JudgeTurn(_Strict):
    scores: dict[str, float] | None = None
    reasons: dict[str, str] = Field(default_factory=dict)
    raw: str | None = Field(None, description="the judge's reply verbatim (may be unparseable on purpose)")
    error: str | None = Field(None, description="the judge call raises this error")
    latency_s: float = Field(0.0, ge=0, description="the judge takes this long to answer")

    @model_validator(mode="after")
    def _one(self) -> JudgeTurn:
        given = [x for x in (self.scores, self.raw, self.error) if x is not None]
        if len(given) != 1:
            raise ValueError("a judge turn has exactly one of scores, raw or error")
        return self


class ToolBehaviour(_Strict):
    output: Any = None
    output_text: str | None = Field(None, description="raw text output; must parse as JSON to pass")
    fail: ScriptedFailure | None = None  # the failure table's scriptable rows (shared/failures.py)
    error: str | None = None
    retry_after_s: float | None = Field(None, ge=0)
    latency_s: float = Field(0.0, ge=0, description="wait this long (after the real tool ran, if it runs)")
    times: int | Literal["always"] = 1

    @model_validator(mode="before")
    @classmethod
    def _mark_output(cls, data: Any) -> Any:
        # ``output: null`` is a scripted output (the tool returned null), so presence of the key
        # is what counts; a stored (dumped) scenario carries the marker itself.
        if isinstance(data, dict) and "output" in data and "_has_output" not in data:
            data = {**data, "_has_output": True}
        return data

    has_output: bool = Field(False, alias="_has_output")

    @model_validator(mode="after")
    def _one_kind(self) -> ToolBehaviour:
        kinds = [self.has_output, self.output_text is not None, self.fail is not None]
        if sum(kinds) > 1:
            raise ValueError("a tool behaviour has at most one of output, output_text or fail")
        if isinstance(self.times, int) and self.times < 1:
            raise ValueError("times must be >= 1 or 'always'")
        return self

    @property
    def runs_real_tool(self) -> bool:
        return not self.has_output and self.output_text is None and self.fail is None


class _Counts(_Strict):
    """How many of a tool's calls ended each way (final outcomes; a retried attempt is not one).

    ``{succeeded: 1, output_invalid: 1}`` reads "succeeded once after one output_invalid". A count
    not stated is not checked; ``0`` states that it never happened."""

    def stated(self) -> dict[str, int]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


TOOL_OUTCOMES: tuple[str, ...] = ("succeeded", *CALL_FAILURES)
"""The keys of ``expect.tools.<tool>``: one per way a call can end (``ToolOutcomes``' fields)."""
_COUNTED = {
    "succeeded": "calls whose result passed the tool's output contract",
    "transient": "still failing after the executor's retries",
    "unknown_tool": "calls of a tool no replica of the stack hosts",
}
if TYPE_CHECKING:

    class ToolOutcomes(_Counts):
        def __init__(self, **counts: int | None) -> None: ...

else:  # a count per way a call can end: one field per row of the failure table that a call can end with
    ToolOutcomes = create_model(
        "ToolOutcomes",
        __base__=_Counts,
        __doc__=_Counts.__doc__,
        **{k: (int | None, Field(None, ge=0, description=_COUNTED.get(k))) for k in TOOL_OUTCOMES},
    )


class Outcome(BaseModel):
    """How a run ended, as an expectation sees it."""

    status: str
    final_output: str | None
    escalations: int
    escalation_kinds: list[str]
    passed: bool | None
    first_draft_passed: bool | None
    submitted: bool
    model_calls: int
    judge_calls: int
    retries: int
    continues: int
    tool_outcomes: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="per tool the model called: final outcomes by kind (TOOL_OUTCOMES)"
    )
    escalation_actions: list[str] = Field(default_factory=list, description="how each resolved escalation was")


class Expectation(_Strict):
    status: Literal["completed", "stopped", "failed", "awaiting_human"] | None = None
    final_output_contains: str | None = None
    final_output_equals: str | None = None
    final_output_not_empty: bool | None = None
    escalations: int | None = Field(None, ge=0)
    escalation_kinds: list[str] | None = None
    passed: bool | None = None
    passed_first_draft: bool | None = None
    submitted: bool | None = None
    model_calls: int | None = Field(None, ge=0)
    max_model_calls: int | None = Field(None, ge=0)
    judge_calls: int | None = Field(None, ge=0)
    retries: int | None = Field(None, ge=0)
    continues: int | None = Field(None, ge=0)
    tools: dict[str, ToolOutcomes] | None = Field(
        None,
        description="per tool, how many of its calls ended each way, e.g. {low_stock: {succeeded: 1, "
        "output_invalid: 1}}. A run that called a tool no replica hosts (unknown_tool) meets its expect "
        "only when this says so for that tool.",
    )
    escalation_actions: list[EscalationAction] | None = Field(
        None, description="the actions the run's escalations were resolved with (in any order), e.g. [provide_result]"
    )

    def mismatches(self, got: Outcome) -> list[str]:
        """What differs between this expectation and how the run ended (empty when it matches)."""
        out = []
        final = got.final_output or ""
        exact = {
            "status": got.status,
            "escalations": got.escalations,
            "passed": got.passed,
            "passed_first_draft": got.first_draft_passed,
            "submitted": got.submitted,
            "model_calls": got.model_calls,
            "judge_calls": got.judge_calls,
            "retries": got.retries,
            "continues": got.continues,
        }
        for name, value in exact.items():
            wanted = getattr(self, name)
            if wanted is not None and value != wanted:
                out.append(f"{name}: expected {wanted}, got {value}")
        if self.final_output_contains is not None and self.final_output_contains not in final:
            out.append(f"final output does not contain {self.final_output_contains!r}: {final[:200]!r}")
        if self.final_output_equals is not None and final != self.final_output_equals:
            out.append(f"final output: expected {self.final_output_equals!r}, got {final[:200]!r}")
        if self.final_output_not_empty and not final.strip():
            out.append("final output is empty")
        if self.escalation_kinds is not None and sorted(got.escalation_kinds) != sorted(self.escalation_kinds):
            out.append(
                f"escalation kinds: expected {sorted(self.escalation_kinds)}, got {sorted(got.escalation_kinds)}"
            )
        if self.max_model_calls is not None and got.model_calls > self.max_model_calls:
            out.append(f"model calls: expected at most {self.max_model_calls}, got {got.model_calls}")
        if self.escalation_actions is not None and sorted(got.escalation_actions) != sorted(self.escalation_actions):
            out.append(
                f"escalation actions: expected {sorted(self.escalation_actions)}, got {sorted(got.escalation_actions)}"
            )
        out.extend(self.tool_mismatches(got.tool_outcomes))
        return out

    def tool_mismatches(self, got: dict[str, dict[str, int]]) -> list[str]:
        """Stated tool outcomes that differ, and any tool no replica hosted that ``tools`` does not state
        (nothing silent: a scenario whose tools are missing never passes by accident)."""
        out = []
        stated = self.tools or {}
        for tool, wanted in sorted(stated.items()):
            counts = got.get(tool, {})
            for kind, n in wanted.stated().items():
                if counts.get(kind, 0) != n:
                    out.append(f"tool {tool}: expected {kind} {n}, got {counts.get(kind, 0)} ({_counts(counts)})")
        for tool, counts in sorted(got.items()):
            n = counts.get("unknown_tool", 0)
            if n and "unknown_tool" not in stated.get(tool, ToolOutcomes()).stated():
                out.append(
                    f"tool {tool}: called {n} time(s) but no replica of the stack hosts it (unknown_tool); "
                    f"start the stack with it, or state tools: {{{tool}: {{unknown_tool: {n}}}}} in expect"
                )
        return out


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "never called"


class Scenario(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    task: str = Field(min_length=1)
    planner: list[PlannerTurn] = Field(default_factory=list)
    judge: list[JudgeTurn] = Field(default_factory=list)
    summaries: list[str] = Field(default_factory=list)
    tools: dict[str, list[ToolBehaviour]] = Field(default_factory=dict)
    rubric: Rubric | None = None
    limits: RunLimits | None = None
    answer_mode: Literal["auto", "submit", "text"] = "auto"
    terminal_tools: list[str] = Field(default_factory=lambda: ["submit_result"])
    allowed_tools: list[str] | None = None
    lessons: bool = False
    expect: Expectation | None = None
    replay: bool = Field(
        False,
        exclude_if=lambda replay: not replay,  # left out unless set: a release before it refuses the field
        description="set by the planner, never by a file: the scenario came on an operator's replay subject, so "
        "the scripted providers replay it even where scripted runs are off (LW_ALLOW_SCRIPTED=false)",
    )

    def effective_rubric(self) -> Rubric | None:
        """The rubric, or — when the scenario scripts judge replies but no rubric — one criterion per
        name its judge scores (equal weights, threshold 0.8), so a scripted judge is always consulted."""
        if self.rubric is not None or not self.judge:
            return self.rubric
        names = list(dict.fromkeys(name for turn in self.judge for name in (turn.scores or {})))
        return Rubric.model_validate({"threshold": 0.8, "criteria": [{"name": n} for n in names or ["overall"]]})

    def called_tools(self) -> list[str]:
        """The tools this scenario's model calls or scripts behaviour for (which the stack must host), sorted;
        ``delegate`` is the planner's own, never a hosted tool."""
        named = {call.name for turn in self.planner for call in turn.tool_calls} | set(self.tools)
        return sorted(named - {"delegate"})

    def tool_behaviour(self, tool: str, attempt_index: int) -> ToolBehaviour | None:
        """The behaviour for the n-th execution attempt of ``tool`` in a run (0-based)."""
        seen = 0
        for entry in self.tools.get(tool, []):
            if entry.times == "always":
                return entry
            if attempt_index < seen + entry.times:
                return entry
            seen += entry.times
        return None


class ScenarioError(ValueError):
    pass


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        lines = problems(err, empty="(scenario)")
        raise ScenarioError(f"{source}: invalid scenario:\n  " + "\n  ".join(lines)) from None


# A scenario is written by hand or by ``replay --save``: a few KB. The bounds keep a hostile file from
# costing more than reading it: YAML aliases (10^8 leaves in 1 KB) are refused outright, and the file
# and the scenario it expands to are capped (an export of a long run is the largest honest input).
MAX_SCENARIO_FILE_BYTES = 16_000_000
MAX_SCENARIO_JSON_BYTES = 4_000_000


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.safe_load`` without anchors and aliases: what a scenario says is what it holds."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            mark = event.start_mark
            what = f"alias *{event.anchor}" if isinstance(event, yaml.AliasEvent) else f"anchor &{event.anchor}"
            raise ScenarioError(
                f"line {mark.line + 1} column {mark.column + 1}: YAML anchors and aliases are not allowed in a "
                f"scenario ({what}); write the value out"
            )
        return super().compose_node(parent, index)


def load_yaml(text: str, source: str) -> Any:
    """One YAML document, safe and alias-free (a :class:`ScenarioError` naming the line otherwise)."""
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader without aliases
    except ScenarioError as err:
        raise ScenarioError(f"{source}: {err}") from None
    except RecursionError:
        raise ScenarioError(f"{source}: not valid YAML: nested too deeply") from None


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_SCENARIO_FILE_BYTES:
            raise ScenarioError(f"{p}: {size} bytes; a scenario file may have at most {MAX_SCENARIO_FILE_BYTES}")
        text = p.read_text()
    except OSError as err:
        raise ScenarioError(f"{p}: cannot read scenario: {err.strerror}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else load_yaml(text, str(p))
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ScenarioError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {err}") from None
    except RecursionError:
        raise ScenarioError(f"{p}: not valid JSON: nested too deeply") from None
    from shared.records import RunRecord, is_record, scenario_from_record

    if is_record(data):  # a run exported by `loopwarden export`: replay its recorded turns and tool results
        try:
            data = scenario_from_record(RunRecord.model_validate(data))
        except ValidationError as err:
            raise ScenarioError(f"{p}: invalid run export: {err.errors()[0]['msg']}") from None
    expanded = len(json.dumps(data, default=str))
    if expanded > MAX_SCENARIO_JSON_BYTES:
        raise ScenarioError(f"{p}: the scenario is {expanded} bytes as JSON; at most {MAX_SCENARIO_JSON_BYTES}")
    return parse_scenario(data, str(p))


# --- the scenario bound to a run (read back by the services that replay it) ----------------------------
SCENARIOS_KEPT = 256  # scripted runs whose scenario a process keeps in memory
_BOUND: weakref.WeakKeyDictionary[Bus, OrderedDict[str, Scenario | None]] = weakref.WeakKeyDictionary()


async def bound_scenario(bus: Bus, run_id: str) -> Scenario | None:
    """The scenario bound to the run (``lw_scenarios``), or None for a run submitted without one. The planner
    binds it at submit, before the run starts, and nothing changes it afterwards: cached per run and per
    bus connection, either way."""
    from shared.subjects import KV_SCENARIOS

    kept = _BOUND.setdefault(bus, OrderedDict())
    if run_id not in kept:
        scenario, _ = await bus.kv_get(KV_SCENARIOS, run_id, Scenario)
        keep_bound(bus, run_id, scenario)
    return kept[run_id]


def keep_bound(bus: Bus, run_id: str, scenario: Scenario | None) -> None:
    """What the planner just bound to the run as it starts (None: a live run, any stray scenario removed), kept
    as ``bound_scenario`` would read it: the run's first model turn, often on this replica, reads nothing."""
    kept = _BOUND.setdefault(bus, OrderedDict())
    kept[run_id] = scenario
    while len(kept) > SCENARIOS_KEPT:
        kept.popitem(last=False)
