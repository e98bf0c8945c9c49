"""A bus or storage error inside the judge is retried; only the model's side is "not judged".

The judge handler runs against the session's real NATS server and KV buckets: a scenario record
that cannot be read makes the handler fail (so the bus helper redelivers the request) instead of
publishing a "not judged" verdict, and once the record is readable the same request is scored.
"""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

from loopwarden.stack import LocalStack
from services.judge.handlers import Judge
from shared import subjects as S
from shared.bus import Bus
from shared.messages import Candidate, Criterion, JudgeRequest, Rubric, Verdict
from shared.scenario import Scenario
from shared.telemetry import setup_telemetry
from tests.support.stacks import settings_for


def request(run_id: str) -> JudgeRequest:
    return JudgeRequest(
        run_id=run_id,
        candidate=Candidate(id=f"{run_id}.c1", iteration=1, kind="text", content="42"),
        task="What is six times seven?",
        rubric=Rubric(criteria=[Criterion(name="correct")], threshold=0.5),
    )


async def test_a_storage_error_in_the_judge_is_retried_never_not_judged(stack: LocalStack) -> None:
    settings = settings_for(stack)
    bus = Bus(settings, "judge-under-test")
    await bus.connect()
    judge = Judge(bus, settings, setup_telemetry("judge-under-test", settings))
    run_id = f"judge-storage-{uuid.uuid4().hex[:8]}"
    req = request(run_id)
    verdict_key = S.kv_key(req.candidate.id)
    try:
        kv = await bus.kv(S.KV_SCENARIOS)
        await kv.put(S.kv_key(run_id), b'{"name": "broken record"')  # unreadable: a storage fault
        with pytest.raises(ValidationError):  # raised to the bus helper, which redelivers the request
            await judge.on_request(req)
        stored, _ = await bus.kv_get(S.KV_VERDICTS, verdict_key, Verdict)
        assert stored is None, "a storage error must not become a verdict"

        scenario = Scenario.model_validate(
            {"name": "judge-storage", "task": req.task, "judge": [{"scores": {"correct": 1.0}}]}
        )
        await bus.kv_put(S.KV_SCENARIOS, S.kv_key(run_id), scenario)
        await judge.on_request(req)  # the redelivery, once storage is readable: scored
        stored, _ = await bus.kv_get(S.KV_VERDICTS, verdict_key, Verdict)
        assert stored is not None and stored.status != "not_judged", stored
        assert stored.score == pytest.approx(1.0)
    finally:
        await bus.stop()
