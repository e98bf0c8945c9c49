"""What a tenant's runs spent on one UTC day (``lw_budgets``, key ``tenant.<t>.<day>``), kept by the governor for
every tenant, with or without a ceiling, so a ceiling set during the day counts the whole day; read by the
planner at submit (a tenant at its ceiling is refused there) and by ``loopwarden fleet``.

The record stays small however many runs a day has: runs still spending are kept by id with their latest total
(re-applying one is harmless), and a run that ended is folded into ``settled_usd`` once (its id is remembered in
``settled`` for a while, so a redelivered final event is not counted twice)."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from shared import subjects as S

KEEP_SETTLED = 512  # ids of runs folded into the day's total that a redelivered final event is recognised by


def today() -> str:
    return datetime.now(UTC).date().isoformat()


def day_key(tenant: str, day: str) -> str:
    return S.kv_key("tenant", tenant, day)


class TenantDay(BaseModel):
    tenant: str
    day: str
    runs: dict[str, float] = Field(default_factory=dict, description="runs still spending: id -> latest total USD")
    settled_usd: float = Field(0.0, description="what the day's ended runs spent")
    settled_runs: int = 0
    settled: list[str] = Field(default_factory=list, description="the latest ended runs' ids (not counted twice)")

    @property
    def spent_usd(self) -> float:
        return round(self.settled_usd + sum(self.runs.values()), 8)

    def spend(self, run_id: str, total_usd: float) -> bool:
        """The run has spent ``total_usd`` so far (its latest total; a lower or equal one changes nothing)."""
        if run_id in self.settled or self.runs.get(run_id, -1.0) >= total_usd:
            return False
        self.runs[run_id] = total_usd
        return True

    def settle(self, run_id: str, total_usd: float) -> bool:
        """The run ended having spent ``total_usd``: folded into the day's total once."""
        if run_id in self.settled:
            return False
        self.runs.pop(run_id, None)
        self.settled_usd = round(self.settled_usd + max(0.0, total_usd), 8)
        self.settled_runs += 1
        self.settled = [*self.settled, run_id][-KEEP_SETTLED:]
        return True
