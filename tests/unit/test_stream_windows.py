"""The de-duplication window of each stream (issue 28, edge 6): nats-server keeps every message id of
the window in memory, so only LW_SUBMIT (what a client or an operator may send again) keeps the long one;
the streams only a redelivered handler publishes to again keep the delivery budget."""

from __future__ import annotations

import pytest

from shared import subjects as S
from shared.bus import stream_config
from shared.settings import Settings


def window(stream: str, **settings: object) -> float | None:
    return stream_config(stream, Settings.model_validate(settings)).duplicate_window


def test_submits_and_requeues_keep_the_long_window() -> None:
    assert window(S.STREAM_SUBMIT) == 600.0
    assert window(S.STREAM_SUBMIT, duplicate_window_s=900) == 900.0


@pytest.mark.parametrize("stream", [S.STREAM_CMD, S.STREAM_EVT, S.STREAM_DLQ])
def test_what_only_a_redelivery_publishes_again_keeps_the_delivery_budget(stream: str) -> None:
    # 6 ack waits of 30 s and the nak delays between them (0.5 + 1 + 2 + 4 + 8 s)
    assert window(stream) == 6 * 30 + 15.5
    assert window(stream, duplicate_window_s=900) == 195.5  # the submit window does not widen it
    assert window(stream, ack_wait_s=3, max_deliver=5, redeliver_delay_s=0.2) == 120.0  # never below 2 minutes
    assert window(stream, redelivery_window_s=45) == 45.0  # set: as set (a soak shortens it)


def test_the_delivery_budget_grows_with_the_deliveries_and_the_ack_wait() -> None:
    assert Settings(ack_wait_s=60, max_deliver=3, redeliver_delay_s=1).delivery_budget_s == 3 * 60 + 1 + 2
