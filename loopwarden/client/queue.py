"""Working the human queue: list, show, claim, renew and resolve escalations."""

from __future__ import annotations

from typing import Any

from loopwarden.client.reads import Reads
from loopwarden.client.refusals import guarded
from shared import subjects as S
from shared.history import HistoryMissing
from shared.messages import (
    ChatMessage,
    EscalationAction,
    EscalationClaim,
    EscalationQuery,
    EscalationReply,
    EscalationResolve,
)


class Queue(Reads):
    """The escalation queue's requests.

    Who claims, renews or resolves is the operator token of the subject (``...claim.<who>``, or
    ``...claim.console.<who>`` when the console acts for them): with per-operator NATS users the
    server lets only that operator publish there, so ``who`` must be the user this client is."""

    @guarded
    async def escalations(
        self,
        status: str = "open",
        run_id: str | None = None,
        *,
        kind: str | None = None,
        tool: str | None = None,
        older_than_s: float | None = None,
        newer_than_s: float | None = None,
    ) -> EscalationReply:
        """The queue's items (``.escalations``, newest first): ``status`` open (default), claimed, resolved or
        all; optionally of one run, of one ``kind`` (schema_cap, fatal, ...), for one ``tool``, or by age."""
        return await self.bus.request(
            S.ESCALATION_LIST,
            EscalationQuery(
                status=status,
                run_id=run_id,
                kind=kind,
                tool=tool,
                older_than_s=older_than_s,
                newer_than_s=newer_than_s,
            ),
            EscalationReply,
        )

    @guarded
    async def show(self, escalation_id: str, turns: int | None = None) -> EscalationReply:
        """One item (``.escalations[0]``) with its context: arguments, allowed actions, and in ``context`` the
        run's last ``turns`` turns (default ``LW_ESCALATION_CONTEXT_TURNS``; 0: none), read from the run's
        conversation now, for every kind of item alike: the queue keeps no copy of them."""
        reply = await self.bus.request(S.ESCALATION_SHOW, EscalationQuery(escalation_id=escalation_id), EscalationReply)
        last = self.settings.escalation_context_turns if turns is None else turns
        if reply.ok and reply.escalations and last > 0:
            item = reply.escalations[0]
            item.context = await self.last_turns(item.run_id, last)
        return reply

    async def last_turns(self, run_id: str, last: int) -> list[ChatMessage]:
        """The run's ``last`` messages as its conversation holds them now (none when the run or its
        conversation is no longer stored)."""
        try:
            return await self.history(run_id, last=last)
        except HistoryMissing:  # removed under the reader (the run was deleted or compacted meanwhile)
            return []

    @guarded
    async def claim(self, escalation_id: str, who: str, via: str | None = None) -> EscalationReply:
        """Claim an item for ``who`` under a lease (``.ok`` false and ``.error`` say why not)."""
        return await self.bus.request(
            S.escalation_rpc("claim", who, via), EscalationClaim(escalation_id=escalation_id), EscalationReply
        )

    @guarded
    async def renew(self, escalation_id: str, who: str, via: str | None = None) -> EscalationReply:
        """Extend ``who``'s lease on an item they claimed."""
        return await self.bus.request(
            S.escalation_rpc("renew", who, via), EscalationClaim(escalation_id=escalation_id), EscalationReply
        )

    @guarded
    async def resolve(
        self,
        escalation_id: str,
        who: str,
        action: EscalationAction,
        note: str = "",
        result: Any = None,
        via: str | None = None,
    ) -> EscalationReply:
        """Resolve an item with one of the actions its kind allows (resume, abort, provide_result with
        ``result`` checked against the tool's output contract, retry, final_answer, ...); the run goes on at once.
        An unclaimed item is claimed for ``who`` first."""
        return await self.bus.request(
            S.escalation_rpc("resolve", who, via),
            EscalationResolve(escalation_id=escalation_id, action=action, note=note, result=result),
            EscalationReply,
        )
