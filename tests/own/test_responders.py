"""A responder answers every request, against a real nats-server: one whose body (sent by reference) cannot be
fetched - here the claim-check stream is gone, so the fetch finds no responder - is answered with the reason,
never left to time out with "Task exception was never retrieved"; and the responder goes on answering."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.bus import Bus
from shared.messages import ErrorReply
from shared.payloads import REF_HEADER, PayloadStore
from shared.settings import Settings
from tests.support.timing import bound

SUBJECT = "lw.v1.rpc.test.echo"


class Echo(BaseModel):
    text: str


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    stack = LocalStack(state_dir=tmp_path, services=())
    stack.start()
    try:
        yield str(stack.nats_url)
    finally:
        stack.stop()


async def test_a_request_whose_body_cannot_be_fetched_is_answered_with_the_reason(server: str) -> None:
    settings = Settings(nats_url=server, rpc_timeout_s=bound(5), js_timeout_s=bound(1))
    echo = Bus(settings, "echo")

    @echo.responder(subject=SUBJECT, model=Echo, reply=lambda reason: ErrorReply(error=reason))
    async def answer(message: Echo) -> BaseModel:
        return Echo(text=f"got {len(message.text)}")

    asker = Bus(settings, "asker")
    await echo.start()
    await asker.connect()
    try:
        assert (await asker.request(SUBJECT, Echo(text="x" * 300_000), Echo)).text == "got 300000"  # by reference
        body = Echo(text="y" * 300_000).model_dump_json().encode()
        ref = await PayloadStore(settings, "asker").put(asker.nc, body)  # stored, then the store goes away
        await asker.js.delete_stream(S.STREAM_PAYLOADS)
        reply = await asker.nc.request(
            SUBJECT, ref.model_dump_json().encode(), timeout=bound(5), headers={REF_HEADER: ref.name}
        )
        refused = ErrorReply.model_validate_json(reply.data)
        assert refused.error.startswith("the request's body could not be read: NoRespondersError"), refused.error
        assert echo.refused_requests == 1
        small = await asker.nc.request(SUBJECT, json.dumps({"text": "hi"}).encode(), timeout=bound(5))
        assert Echo.model_validate_json(small.data).text == "got 2"  # still answering
    finally:
        await asker.stop()
        await echo.stop()
