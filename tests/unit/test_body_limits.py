"""Bounds as plain rules: every message type a service reads has a body limit near its real size, a body over it
is refused before anything is fetched, a bucket's values read by reference are bounded, and every stream says
what it does when full."""

from __future__ import annotations

import json
from typing import Any

import pytest
from nats.js.api import DiscardPolicy
from pydantic import ValidationError

from shared import subjects as S
from shared.bus import stream_config
from shared.channels import CHANNELS
from shared.messages import RunRead
from shared.payloads import KV_REF_KEY, REF_HEADER, PayloadStore, PayloadTooLarge, ref_for
from shared.settings import BODY_MAX_BYTES, Settings
from shared.settings.runs import TOOL_SIZED

NO_CONNECTION: Any = None  # a refusal before fetching never touches the connection


def test_every_type_a_service_reads_has_its_own_limit() -> None:
    read = {c.model.__name__ for c in CHANNELS if c.model is not None and c.subscribers and c.kind != "api"}
    assert read, "the channel table lists what services read"
    missing = sorted(read - set(BODY_MAX_BYTES) - set(TOOL_SIZED))
    assert missing == [], f"no body limit of their own (LW_BODY_MAX_BYTES): {missing}"


def test_requests_are_limited_near_their_real_size() -> None:
    settings = Settings()
    largest_read = RunRead(
        run_id="r" * 64,
        start=2**62,
        end=2**62,
        last=2**40,
        subjects="lw.v1.evt." + ".".join(["x" * 120] * 2),
        bucket="lw_model_calls",
        key="k" * 256,
    )
    assert len(largest_read.model_dump_json()) < 1024 < settings.body_limit("RunRead") <= 4096
    assert settings.body_limit("EscalationQuery") <= 4096 and settings.body_limit("BudgetRequest") <= 16 * 1024
    # a tool's output (and what carries one) follows LW_TOOL_OUTPUT_MAX_BYTES
    assert settings.body_limit("ToolResultRaw") > settings.tool_output_max_bytes
    small = Settings(tool_output_max_bytes=1024 * 1024)
    assert small.body_limit("ToolOutcome") == 1024 * 1024 + 2 * 1024 * 1024
    assert Settings(body_max_bytes={"RunRead": 4096}).body_limit("RunRead") == 4096


async def test_a_body_over_its_limit_is_refused_inline_and_by_reference_before_a_chunk_is_fetched() -> None:
    store = PayloadStore(Settings(), "client")
    with pytest.raises(PayloadTooLarge, match="over the limit of 2048"):
        await store.inflate(NO_CONNECTION, b" " * 4096, {}, max_bytes=2048)
    ref = ref_for(b"x" * (63 * 1024 * 1024), "client_acme")
    with pytest.raises(PayloadTooLarge, match="66060288 bytes, over the limit of 2048"):
        await store.inflate(NO_CONNECTION, ref.model_dump_json().encode(), {REF_HEADER: ref.name}, max_bytes=2048)
    value = json.dumps({KV_REF_KEY: ref.model_dump()}).encode()
    with pytest.raises(PayloadTooLarge, match="LW_VALUE_MAX_BYTES"):
        await store.inflate_value(NO_CONNECTION, value, max_bytes=Settings().value_limit(S.KV_AGENTS))


def test_each_stream_is_bounded_and_says_what_it_drops_when_full() -> None:
    settings = Settings()
    for name in (S.STREAM_SUBMIT, S.STREAM_CMD, S.STREAM_EVT, S.STREAM_DLQ, S.STREAM_PAYLOADS):
        cfg = stream_config(name, settings)
        assert cfg.max_bytes is not None and cfg.max_bytes > 0, name
    # a full submit stream refuses the new submit; commands and events are never dropped in silence
    for name in (S.STREAM_SUBMIT, S.STREAM_CMD, S.STREAM_EVT, S.STREAM_PAYLOADS):
        assert stream_config(name, settings).discard == DiscardPolicy.NEW, name
    assert stream_config(S.STREAM_DLQ, settings).discard == DiscardPolicy.OLD
    assert stream_config(S.STREAM_SUBMIT, settings).max_msgs == 1_000_000
    bounded = Settings(stream_max_bytes={"LW_SUBMIT": 16 * 1024 * 1024})
    assert stream_config(S.STREAM_SUBMIT, bounded).max_bytes == 16 * 1024 * 1024
    assert stream_config(S.STREAM_EVT, bounded).max_bytes == settings.stream_bytes(S.STREAM_EVT)  # the rest stay


def test_a_bound_that_is_no_stream_or_too_small_stops_the_service_naming_it() -> None:
    with pytest.raises(ValidationError, match="not a bounded stream: LW_NOPE"):
        Settings(stream_max_bytes={"LW_NOPE": 1024 * 1024 * 1024})
    with pytest.raises(ValidationError, match="lw_runs: at least"):
        Settings(bucket_max_bytes={"lw_runs": 10})
    assert Settings(bucket_max_bytes={"lw_runs": 2**31}).bucket_bytes("lw_runs") == 2**31
    assert Settings().bucket_bytes("lw_lessons") == Settings().bucket_max_bytes["*"]
