"""What a run accepts before anything is built from it (pure): who submitted it, what it may set.

A client submits on ``cmd.run.submit.<tenant>``; the server lets each client user publish only its own
tenant's subject, so the tenant is the subject's last token, never the body's word. Only the planner
starts a child run (``cmd.run.spawn``, which no client may publish): the ``parent_*`` fields and a depth
are accepted there only. Per-run limits are capped by settings, and a scenario (a scripted run) is
accepted only where scripted runs are allowed, and only up to its size limit.

``admit`` returns the submit as the run will be started (its tenant filled in), or why it is refused:
one line naming the field and what it broke, for the dead letter.
"""

from __future__ import annotations

import json
import re

from shared import subjects as S
from shared.messages import NAME_PATTERN, RunSubmit
from shared.settings import Settings

_TENANT = re.compile(NAME_PATTERN)


class Refused(Exception):
    """A submit the planner does not start (the reason is one line, for the dead letter)."""


def tenant_of(subject: str) -> str:
    """The tenant a submit subject names (``lw.v1.cmd.run.submit.<tenant>``)."""
    prefix = S.RUN_SUBMIT_PREFIX + "."
    tenant = subject[len(prefix) :] if subject.startswith(prefix) else ""
    if not _TENANT.match(tenant):
        raise Refused(f"not a submit subject of a tenant: {subject[:200]}")
    return tenant


def admit(submit: RunSubmit, subject: str, settings: Settings) -> RunSubmit:
    """The submit as the run will start, or ``Refused``: ``subject`` is where it arrived."""
    if subject == S.RUN_SPAWN:  # the planner's own: a child run, its limits derived from its parent's
        check_scenario(submit, settings)
        return submit
    tenant = tenant_of(subject)
    if submit.tenant is not None and submit.tenant != tenant:
        raise Refused(f"tenant {submit.tenant!r} is not the submitter's: this subject submits for {tenant!r}")
    spawned = {
        "parent_run_id": submit.parent_run_id,
        "parent_call_id": submit.parent_call_id,
        "parent_iteration": submit.parent_iteration or None,
        "depth": submit.depth or None,
    }
    named = [field for field, value in spawned.items() if value is not None]
    if named:
        raise Refused(f"{', '.join(named)}: only the planner starts a sub-agent run (cmd.run.spawn)")
    check_limits(submit, settings)
    check_scenario(submit, settings)
    return submit.model_copy(update={"tenant": tenant})


def check_limits(submit: RunSubmit, settings: Settings) -> None:
    """Every per-run limit the submit sets is at most its cap (``LW_RUN_LIMIT_CAPS``)."""
    for field, cap in settings.run_limit_caps.items():
        value = getattr(submit.limits, field)
        if value is not None and value > cap:
            raise Refused(f"limits.{field} {value:g} is over the cap {cap:g} (LW_RUN_LIMIT_CAPS)")


def check_scenario(submit: RunSubmit, settings: Settings) -> None:
    """A scenario only where scripted runs are allowed, and no larger than ``LW_SCENARIO_MAX_BYTES``."""
    if submit.scenario is None:
        return
    if not settings.allow_scripted:
        raise Refused("scenario: scripted runs are not allowed here (LW_ALLOW_SCRIPTED=false)")
    size = len(json.dumps(submit.scenario, separators=(",", ":"), ensure_ascii=False).encode())
    if size > settings.scenario_max_bytes:
        raise Refused(f"scenario: {size} bytes is over the limit {settings.scenario_max_bytes} (LW_SCENARIO_MAX_BYTES)")
