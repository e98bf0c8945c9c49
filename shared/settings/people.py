"""People: the human queue's leases and SLAs, the operators' roster and the console."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, Field, SecretStr, field_validator


def json_object(v: str) -> dict[str, Any]:
    """A setting's JSON object, or a ``ValueError`` saying why it is not one."""
    try:
        data = json.loads(v)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err.msg} at column {err.colno}") from None
    if not isinstance(data, dict):
        raise ValueError("must be a JSON object")
    return data


class PeopleSettings(BaseModel):
    # --- escalation queue and console -------------------------------------------------
    escalation_lease_s: float = Field(300.0, gt=0, description="a claim expires unless renewed within this")
    escalation_sweep_s: float = Field(1.0, gt=0, description="how often leases and SLA deadlines are checked")
    escalation_context_turns: int = Field(
        6, ge=0, description="the run's last turns shown with a queue item (the console, `escalations show`)"
    )
    escalation_slas: str | None = Field(
        None,
        description='JSON: kind -> {"after_s": seconds, "action": abort|deny|accept_if_judged|fall_back}, '
        "over the defaults",
    )
    operators: str | None = Field(
        None, description='JSON: operator -> kinds they may act on, e.g. {"alice": ["*"], "bob": ["not_judged"]}'
    )
    console_host: str = "127.0.0.1"
    console_port: int = Field(8700, ge=0, le=65535)
    console_users: str | None = Field(None, description="JSON: operator -> bcrypt hash of their console password")
    console_secret: SecretStr | None = Field(
        None, description="signs console sessions; set the same value on every replica (default: random per process)"
    )
    console_session_s: float = Field(
        3600.0, gt=0, le=24 * 3600.0, description="how long a console login lasts (at most a day: revocations expire)"
    )
    console_public_url: str | None = Field(
        None,
        description="the console's address as browsers see it (behind a proxy): a form posted from any other "
        "origin is refused (default: the request's own scheme and Host)",
    )
    console_secure_cookie: bool = Field(
        False, description="mark the session cookie Secure (automatic when served over TLS or X-Forwarded-Proto https)"
    )
    console_passwords_file: str | None = Field(
        None, description="without LW_CONSOLE_USERS: write a fresh password per operator here (local stack)"
    )
    jaeger_url: str = Field("http://127.0.0.1:16686", description="Jaeger UI base; runs link to <url>/trace/<id>")
    config_refresh_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="how old the applied access file (lw_config: roster, console logins, tenant policies) a "
        "service acts on may be: a `loopwarden config apply` takes effect within this",
    )

    @field_validator("escalation_slas")
    @classmethod
    def _slas(cls, v: str | None) -> str | None:
        if v:
            from typing import get_args

            from shared.messages import EscalationKind, SlaAction

            data = json_object(v)
            for kind, rule in data.items():
                if kind not in get_args(EscalationKind):
                    raise ValueError(f"unknown kind {kind!r} (kinds: {', '.join(get_args(EscalationKind))})")
                if not isinstance(rule, dict) or set(rule) - {"after_s", "action"}:
                    raise ValueError(f"{kind}: must be {{'after_s': seconds, 'action': ...}}")
                after = rule.get("after_s", 1)
                if not isinstance(after, int | float) or after <= 0:
                    raise ValueError(f"{kind}.after_s must be a number above 0")
                if "action" in rule and rule["action"] not in get_args(SlaAction):
                    raise ValueError(f"{kind}.action must be one of {', '.join(get_args(SlaAction))}")
        return v

    @field_validator("operators", "console_users")
    @classmethod
    def _name_map(cls, v: str | None) -> str | None:
        if v:
            for name, value in json_object(v).items():
                if not re.fullmatch(r"[A-Za-z0-9_-]+", name) or name in ("console", "sla"):
                    raise ValueError(f"operator name {name!r}: letters, digits, '-' and '_' only; not console/sla")
                if not isinstance(value, list | str):
                    raise ValueError(f"{name}: expected a list of kinds or a bcrypt hash")
        return v
