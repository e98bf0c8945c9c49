"""What a planner replica keeps of its runs (``services/planner/store.py``): the last states it stored or read, a
bounded few, so a step reads nothing first. A queued run's state is kept only where there is room: a burst of
queued submits must not push out the states of the runs in flight (each would be read again at its next step)."""

from __future__ import annotations

from services.planner.state import Iteration, RunState
from services.planner.store import RunStore
from shared.bus import Bus
from shared.settings import Settings
from tests.support.transitions import run_config

CONFIG = run_config(max_iterations=10, run_token_budget=10_000, context_budget_tokens=5000, model="m")


def run(run_id: str, status: str = "running") -> RunState:
    return RunState(run_id=run_id, task="t", config=CONFIG, iteration=Iteration(n=1), status=status)


def test_queued_runs_take_no_room_from_runs_in_flight() -> None:
    store = RunStore(Bus(Settings(), "planner"))
    for k in range(RunStore.SIZE):
        store.keep(run(f"busy-{k}"), 1)
    for k in range(3 * RunStore.SIZE):  # a burst of queued submits
        store.keep(run(f"queued-{k}", "queued"), 1, cold=True)
    assert all(store.kept(f"busy-{k}") is not None for k in range(RunStore.SIZE))
    assert not any(store.kept(f"queued-{k}") for k in range(3 * RunStore.SIZE))


def test_a_queued_run_is_kept_while_there_is_room_and_goes_first() -> None:
    store = RunStore(Bus(Settings(), "planner"))
    store.keep(run("queued", "queued"), 1, cold=True)
    for k in range(RunStore.SIZE - 1):
        store.keep(run(f"busy-{k}"), 1)
    assert store.kept("queued") is not None  # room for it: its start reads nothing
    store.keep(run("one-more"), 1)
    assert store.kept("queued") is None and store.kept("busy-0") is not None
