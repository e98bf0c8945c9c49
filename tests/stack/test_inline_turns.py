"""The planner takes a run's next model turn where the outcome (verdict, resolution) that schedules it
is applied, before that message is acked, instead of publishing the advance to itself: one hand-off
through the server fewer per step. The advance stays in the message's stored outbox, so a redelivery
(the planner died during the turn) takes the turn again, and reuses the model's stored answer.

Observed on the server, as a plain NATS subscriber sees what the services send (the real stack).
"""

from __future__ import annotations

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from services.planner import ids
from shared import subjects as S
from shared.bus import RUN_ID_HEADER
from shared.messages import RunAdvance
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support.runs import calculator_steps, healthy_planner_finishes, planner_dies
from tests.support.timing import bound
from tests.support.wire import Wire


async def test_a_step_takes_its_next_turn_without_an_advance_on_the_wire(client: Client) -> None:
    """Four tool steps and a final turn: the first turn is asked for with an advance (from the
    submit); the four after it are taken where each tool's outcome is applied."""
    async with Wire(client, S.RUN_ADVANCE, f"$KV.{S.KV_MODEL_CALLS}.>") as wire:
        run_id = await client.submit_scenario(parse_scenario(calculator_steps("inline", 4)))
        state = await client.wait(run_id, timeout=bound(30))
    assert state.status == "completed", state.final_reason
    assert state.model_calls == 5
    advances = [m for m in wire.seen if m.subject == S.RUN_ADVANCE and m.headers.get(RUN_ID_HEADER) == run_id]
    assert len(advances) == 1, [m.data for m in advances]
    answers = [m.subject for m in wire.seen if m.subject.startswith(f"$KV.{S.KV_MODEL_CALLS}.{run_id}")]
    assert len(answers) == 5 and len(set(answers)) == 5  # one model call per turn


async def test_a_planner_dying_after_a_model_answer_is_stored_never_asks_the_model_again(
    no_planner: LocalStack,
) -> None:
    """Planners that exit as soon as a turn's new model answer is stored, before the run's record is
    saved (``LW_FAULT_INJECT=after_model_answered``): the first dies in the run's first turn (taken
    from the submit's advance), the second reuses that answer from the redelivered advance, runs the
    tool step, and dies in the second turn (taken inline, where the tool's outcome is applied, which is
    saved with that turn, so the record is still at turn 1). A healthy planner takes over, first the
    advance to turn 2 as a planner of the previous version would re-publish it (a first delivery: the run
    is not at that turn, it is dropped), then the redelivered outcome: applied once, the second turn
    reuses its stored answer, and the run completes.
    Every turn's answer was stored once (the model was asked once per turn) and the tool ran once."""
    async with Client(Settings(nats_url=no_planner.nats_url)) as client:
        async with Wire(client, S.RUN_ADVANCE, f"$KV.{S.KV_MODEL_CALLS}.>") as wire:
            scenario = parse_scenario(calculator_steps("dies-after-answer", 1))
            run_id = await client.submit_scenario(scenario, accepted=False)  # no planner runs yet
            for label in ("planner-dies-turn-1", "planner-dies-turn-2"):
                await planner_dies(no_planner, "after_model_answered", label)
            snap = await client.state(run_id)
            # the outcome is saved together with the turn it schedules: the record is still at turn 1
            assert snap is not None and snap.iteration.n == 1 and snap.model_calls == 1, snap
            # a planner of the previous version, handed the redelivered outcome, re-publishes its whole
            # outbox: the advance to turn 2 then arrives as a first delivery, before the outcome again
            again = RunAdvance(run_id=run_id, iteration=2)
            await client.bus.publish(S.RUN_ADVANCE, again, msg_id=ids.advance(run_id, 2))
            state = await healthy_planner_finishes(no_planner, client, run_id)
        kinds = [e.kind for e in await client.events(run_id)]
    assert state.status == "completed", state.final_reason
    assert state.model_calls == 2 and state.final_output == "done"
    answers = [m.subject.rsplit(".", 1)[-1] for m in wire.seen if run_id in m.subject and "KV" in m.subject]
    assert sorted(answers) == ["turn1", "turn2"], answers  # each turn's answer stored once: no second model call
    advances = [m for m in wire.seen if m.subject == S.RUN_ADVANCE and m.headers.get(RUN_ID_HEADER) == run_id]
    assert {m.headers.get("Nats-Msg-Id") for m in advances} == {ids.advance(run_id, 1), ids.advance(run_id, 2)}
    assert kinds.count("tool.succeeded.calculator") == 1 and kinds.count("run.completed") == 1, kinds
