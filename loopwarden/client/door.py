"""What a submit that was not accepted raises: refused at the door (``Refused``, ``QuotaExceeded``), or not
answered in time (``NotAccepted``)."""

from __future__ import annotations

from shared.messages import Refusal


class Refused(Exception):
    """The run was refused at the door and nothing of it started (``Client.submit``, ``Client.wait``, ``run``):
    ``refusal.reason`` says why in one line; the run's record says the same (status ``refused``)."""

    def __init__(self, run_id: str, refusal: Refusal) -> None:
        super().__init__(f"run {run_id} refused: {refusal.reason}")
        self.run_id = run_id
        self.refusal = refusal

    @property
    def quota(self) -> str | None:
        return self.refusal.quota

    @property
    def limit(self) -> float | None:
        return self.refusal.limit

    @property
    def current(self) -> float | None:
        return self.refusal.current

    @property
    def reason(self) -> str:
        return self.refusal.reason


class QuotaExceeded(Refused):
    """Refused because the tenant is at one of its quotas (``quota``: ``max_runs``, ``max_human_items``,
    ``max_stored_bytes``, ``daily_ceiling_usd``) or the submit stream is full (``submit_stream``): ``limit`` is the
    quota, ``current`` the tenant's figure when the submit arrived."""


def refusal_error(run_id: str, refusal: Refusal) -> Refused:
    return QuotaExceeded(run_id, refusal) if refusal.quota is not None else Refused(run_id, refusal)


class NotAccepted(TimeoutError):
    """No planner accepted or refused the submit within ``LW_SUBMIT_ANSWER_S``: it is stored in the submit stream
    and is taken when a planner runs (``loopwarden status RUN`` shows where it is)."""

    def __init__(self, run_id: str, waited_s: float) -> None:
        super().__init__(
            f"no planner answered the submit of {run_id} in {waited_s:.0f}s: it is stored and starts when a planner "
            f"takes it (`loopwarden status {run_id}` shows where it is; is a planner running?)"
        )
        self.run_id = run_id
