"""Judge bus handler: score a fresh candidate exactly once.

Verdicts are stored per candidate id; a redelivered request republishes the stored verdict
instead of calling the judge model again. Any failure — provider error, exhausted script,
missing setting, unparseable reply — yields a *not judged* verdict with its reason.
"""

from __future__ import annotations

import logging

from services.judge import ids, scoring
from shared import metrics as M
from shared import subjects as S
from shared import telemetry as T
from shared.backoff import BackoffPolicy
from shared.bus import Bus
from shared.messages import ChatMessage, JudgeRequest, Verdict
from shared.providers.base import ModelProvider, ModelRequest, ProviderError, complete_with_retry
from shared.providers.select import run_provider
from shared.ratelimit.gate import RateLimiter, shown_on
from shared.settings import Settings

log = logging.getLogger("loopwarden.judge")


class Judge:
    def __init__(self, bus: Bus, settings: Settings, telemetry: T.Telemetry) -> None:
        self.bus, self.settings = bus, settings
        self.tracer = telemetry.tracer("loopwarden.judge")
        self.gen_ai = telemetry.gen_ai
        meter = telemetry.meter("loopwarden.judge")
        self.verdicts = meter.create_counter(M.JUDGE_VERDICTS, description="verdicts by status")
        # the judge's provider key (perhaps not the planner's) is rate limited fleet-wide like the planner's
        self.limiter = RateLimiter(bus, settings, telemetry.meter("loopwarden.ratelimit"))

    def register(self) -> None:
        self.bus.consumer(durable=S.DURABLE_JUDGE, filter_subjects=[S.JUDGE_SCORE], model=JudgeRequest)(self.on_request)

    async def on_request(self, req: JudgeRequest) -> None:
        key = S.kv_key(req.candidate.id)
        stored, _ = await self.bus.kv_get(S.KV_VERDICTS, key, Verdict)
        if stored is None:
            # Another replica may have judged it meanwhile: the first verdict stored stands.
            stored, _, _ = await self.bus.create_or_get(S.KV_VERDICTS, key, await self.judge(req))
            self.verdicts.add(1, {"status": stored.status})
        await self.bus.publish(S.JUDGE_VERDICT, stored, msg_id=ids.verdict(req.candidate.id))

    async def judge(self, req: JudgeRequest) -> Verdict:
        model = self.settings.judge_model
        with self.tracer.start_as_current_span(
            "judge candidate",
            attributes={T.LW_RUN_ID: req.run_id, "loopwarden.candidate.id": req.candidate.id},
        ) as span:
            span.set_attribute("loopwarden.judge.judged_before", req.judged_before)
            # Reading the bus or storage (which provider serves the run) is outside the "not judged"
            # boundary: an error there is raised, so the bus helper redelivers the request; only the
            # model's side is "not judged".
            try:
                provider = await run_provider(self.bus, self.settings, "judge", req.run_id)
            except ProviderError as err:  # misconfigured (e.g. no key for a live run): not judged
                verdict = scoring.not_judged(req, f"judge call failed: {err}", model)
            else:
                verdict = await self.ask(req, provider, model)
                # which provider judged: a scenario's verdict is what its submitter wrote, never a lesson
                verdict = verdict.model_copy(update={"judge_provider": provider.name})
            span.set_attribute(T.LW_VERDICT, verdict.status)
            if verdict.score is not None:
                span.set_attribute(T.LW_SCORE, verdict.score)
            return verdict

    async def ask(self, req: JudgeRequest, provider: ModelProvider, model: str) -> Verdict:
        """The judge model's verdict on the candidate; any failure on the model's side is "not judged"."""
        try:
            request = ModelRequest(
                purpose="judge",
                model=model,
                system=scoring.JUDGE_SYSTEM,
                messages=[ChatMessage.user(scoring.judge_prompt(req))],
                max_tokens=self.settings.judge_max_output_tokens,
                run_id=req.run_id,
                seq=req.judged_before,
            )
            policy = BackoffPolicy(
                self.settings.model_retry_attempts,
                self.settings.model_retry_base_s,
                self.settings.model_retry_max_s,
                self.settings.model_timeout_s,
            )
            gate = self.limiter.gate(
                provider,
                purpose="judge",
                max_wait_s=self.settings.rate_limit_max_wait_s,
                notice=shown_on(self.bus, req.run_id, lambda: req.candidate.iteration),
            )
            response = await complete_with_retry(provider, request, policy, self.tracer, self.gen_ai, gate=gate)
        except ProviderError as err:
            verdict = scoring.not_judged(req, f"judge call failed: {err}", model)
        except Exception as err:  # a judge exception is "not judged", never a default score
            log.exception("judge failed on %s", req.candidate.id)
            verdict = scoring.not_judged(req, f"judge raised {type(err).__name__}: {err}", model)
        else:
            try:
                parsed = scoring.parse_reply(response.text, req.rubric)
            except scoring.NotJudged as err:
                verdict = scoring.not_judged(req, str(err), response.model or model, response.usage)
            else:
                verdict = scoring.score(req, parsed, response.model or model, response.usage)
        return verdict
