"""Agent definitions (pure): read one from a file, and the record a registration stores.

An agent is what every run of it gets: instructions, the planner's model (and the provider its live runs
need), a tool allowlist, a rubric, limits, an answer mode and who may run it (``shared.messages.Agent``).
It is kept as a YAML or JSON file (``schemas/agent.json`` is its JSON Schema) or built in Python
(``loopwarden.Agent(...)``), registered with the stack (``lw_agents``, one key per name) and run by name.

Each registration that changes the definition stores the next version; registering the same definition
again changes nothing. A run records the version it used (``RunSnapshot.agent_version``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from shared.canonical import digest_of
from shared.describe import problems
from shared.messages import Agent, AgentRecord, AgentRight
from shared.scenario import ScenarioError, load_yaml

MAX_AGENT_FILE_BYTES = 1_000_000


class AgentError(ValueError):
    """An agent file or definition that cannot be used (one line, or one line per problem)."""


def parse_agent(data: Any, source: str = "<agent>") -> Agent:
    if isinstance(data, Agent):
        return data
    try:
        return Agent.model_validate(data)
    except ValidationError as err:
        raise AgentError(f"{source}: invalid agent:\n  " + "\n  ".join(problems(err, empty="(agent)"))) from None


def load_agent(path: str | Path) -> Agent:
    """The agent a YAML (``.yaml``/``.yml``) or JSON file defines, or :class:`AgentError` naming the file (one
    line, whatever the file holds: nesting too deep for the parser, bytes that are not UTF-8)."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_AGENT_FILE_BYTES:
            raise AgentError(f"{p}: an agent file may have at most {MAX_AGENT_FILE_BYTES} bytes")
        text = p.read_bytes().decode("utf-8")
    except OSError as err:
        raise AgentError(f"{p}: cannot read agent: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise AgentError(f"{p}: not UTF-8 text (byte {err.start} is {err.object[err.start]:#04x})") from None
    what = "JSON" if p.suffix == ".json" else "YAML"
    try:
        data = json.loads(text) if p.suffix == ".json" else load_yaml(text, str(p))
    except RecursionError:
        raise AgentError(f"{p}: not valid {what}: nested too deeply") from None
    except (json.JSONDecodeError, yaml.YAMLError, ScenarioError) as err:
        raise AgentError(f"{p}: not valid {what}: {' '.join(str(err).split())}") from None
    try:
        return parse_agent(data, str(p))
    except RecursionError:
        raise AgentError(f"{p}: invalid agent: nested too deeply") from None


def agent_digest(agent: Agent) -> str:
    return digest_of(agent.model_dump(mode="json", by_alias=True))


def next_record(stored: AgentRecord | None, agent: Agent, registered_by: str | None = None) -> AgentRecord | None:
    """What registering ``agent`` stores over ``stored``: version 1, or one more than the stored version
    when the definition changed; None when it is the stored one already (nothing to write)."""
    digest = agent_digest(agent)
    if stored is not None and stored.digest == digest:
        return None
    version = (stored.version + 1) if stored else 1
    return AgentRecord(agent=agent, version=version, digest=digest, registered_by=registered_by)


def registration_refusal(user: str, right: AgentRight, name: str, stored: AgentRecord | None) -> str | None:
    """Why ``user`` may not register agent ``name`` over ``stored`` (None: it may). The roster decides
    (``agents``: ``none``, ``own`` - new agents and those it registered itself -, ``all``); the admin may always."""
    if user == "admin" or right == "all":
        return None
    if right == "none":
        return f"{user} may not register agents (the roster gives it `agents: none`)"
    if stored is not None and stored.registered_by != user:
        by = stored.registered_by or "someone before registrations were recorded"
        return f"agent {name!r} was registered by {by}: {user} may replace only the agents it registered (agents: own)"
    return None
