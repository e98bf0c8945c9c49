"""Agent registrations, decided by the roster and recorded with who made them (security review 4, L1).

An operator registers an agent on ``lw.v1.rpc.agents.register.<operator>``: the server lets only that
operator's user publish there, so the last token is who it is. Whether it may - register at all, and replace
the agent already stored under the name - is the roster's ``agents`` right (``none``, ``own``, ``all``; the
applied access file, else every operator of ``LW_OPERATORS`` may, as before), and the stored record names it
(``AgentRecord.registered_by``). Operators read ``lw_agents``; only this service (and the admin) writes it.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError

from shared import subjects as S
from shared.agents import next_record, registration_refusal
from shared.bus import Bus, CasConflict
from shared.describe import describe
from shared.live_config import ConfigUnreadable, LiveConfig
from shared.messages import AgentRecord, AgentRegister, AgentRegisterReply

log = logging.getLogger("loopwarden.escalation")
ATTEMPTS = 10


class AgentRegistrations:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.live = LiveConfig(bus)

    def register(self) -> None:
        error = lambda reason: AgentRegisterReply(ok=False, error=reason)  # noqa: E731
        self.bus.subject_responder(subject=f"{S.AGENT_REGISTER_PREFIX}.*", model=AgentRegister, reply=error)(
            self.on_register
        )

    async def on_register(self, req: AgentRegister, subject: str) -> AgentRegisterReply:
        user = subject.rsplit(".", 1)[-1]
        name = req.agent.name
        try:
            right = await self.live.agent_right(user)
        except ConfigUnreadable as err:
            return AgentRegisterReply(ok=False, error=f"the operators' roster cannot be read right now: {err}")
        for _ in range(ATTEMPTS):
            try:
                stored, revision = await self.bus.kv_get(S.KV_AGENTS, name, AgentRecord)
            except ValidationError as err:  # an unreadable value: only a right to replace any may write over it
                stored, revision = None, await self._revision(name)
                if right != "all" and user != "admin":
                    unreadable = f"the stored agent {name!r} cannot be read ({describe(err)})"
                    return self._refused(user, name, f"{unreadable}: {user} may not replace it")
            why = registration_refusal(user, right, name, stored)
            if why is not None:
                return self._refused(user, name, why)
            record = next_record(stored, req.agent, registered_by=user)
            if record is None:
                assert stored is not None
                return AgentRegisterReply(ok=True, record=stored, unchanged=True)
            try:
                await self.bus.kv_put(S.KV_AGENTS, name, record, revision=revision)
            except CasConflict:  # registered meanwhile: decided again on top of that one
                continue
            log.info("agent %s version %d registered by %s", name, record.version, user)
            return AgentRegisterReply(ok=True, record=record)
        return AgentRegisterReply(ok=False, error=f"agent {name!r} is being registered by others: try again")

    def _refused(self, user: str, name: str, why: str) -> AgentRegisterReply:
        log.warning("refused the registration of agent %s by %s: %s", name, user, why)
        return AgentRegisterReply(ok=False, error=f"refused: {why}")

    async def _revision(self, name: str) -> int:
        kv = await self.bus.kv(S.KV_AGENTS)
        entry = await kv.get(name)
        return entry.revision or 0
