"""One channel table (``shared/channels.py``): the publish rights of every user and the AsyncAPI publishers
are derived from its rows, so a new channel is one row - and the derivation keeps each user to its own."""

from __future__ import annotations

import pytest

from loopwarden.generate import asyncapi
from shared import channels, permissions
from shared import subjects as S
from shared.channels import CHANNELS, Channel, covers
from shared.messages import RunEvent


def test_a_new_row_is_the_only_edit_for_the_grants_and_the_document(monkeypatch: pytest.MonkeyPatch) -> None:
    row = Channel(f"{S.P}.evt.judge.calibrated.{{tool}}", RunEvent, ("judge",), (), "event", "a judge recalibrated")
    monkeypatch.setattr(channels, "CHANNELS", (*CHANNELS, row))
    assert f"{S.P}.evt.judge.calibrated.>" in permissions.published("judge")
    assert f"{S.P}.evt.judge.calibrated.>" not in permissions.published("planner")
    documented = {p.subject: p for p in asyncapi._published()["judge"]}
    assert documented[f"{S.P}.evt.judge.calibrated.{{tool}}.{{run}}"].model is RunEvent
    assert row.stream == S.STREAM_EVT


def test_pinned_params_keep_each_publisher_to_its_own_name() -> None:
    assert S.dead_letter("judge") in permissions.published("judge")
    assert not any(
        p.startswith(f"{S.DLQ_PREFIX}.") and p != S.dead_letter("judge") for p in permissions.published("judge")
    )
    assert S.escalation_rpc("resolve", "bob") in permissions.published("bob")
    assert S.escalation_rpc("resolve", "alice") not in permissions.published("bob")


def test_a_tenant_bound_client_publishes_its_own_submits_and_reads_only() -> None:
    user = permissions.user_of("acme")
    assert set(permissions.published(user)) == {
        S.run_submit("acme"),
        *(S.run_read(verb, "acme") for verb in S.RUN_READ_VERBS),
        S.run_list("acme"),
        S.flow_view("acme"),  # its own row of the fleet's view
    }
    assert not any(p.endswith(f".{S.REPLAY}") for p in permissions.published(user))  # replays: the operators'
    replays = f"{S.RUN_SUBMIT_PREFIX}.*.{S.REPLAY}"  # any tenant's: the replayed run's pays
    assert replays in permissions.published("alice") and replays in permissions.published("console")
    assert S.run_submit(S.DEFAULT_TENANT) not in permissions.published("console")
    # the default tenant's client reads the queue and the consumers, but no one else's submits or reads
    default = permissions.published("client")
    assert S.run_submit(S.DEFAULT_TENANT) in default and S.ESCALATION_LIST in default
    assert not any(p.startswith(S.RUN_READ_PREFIX) or p == S.run_submit("acme") for p in default)


def test_failure_types_are_granted_to_the_service_that_decides_them() -> None:
    executor, validator = permissions.published("executor"), permissions.published("validator")
    assert f"{S.FAILURE_PREFIX}.output_invalid.>" in validator
    # the executor decides one kind of it: a result over the size limit, which it never sends on to be validated
    # (services/executor/finishing.py); without the right, a locked executor's publish was refused
    assert f"{S.FAILURE_PREFIX}.output_invalid.>" in executor
    assert f"{S.FAILURE_PREFIX}.transient.>" in executor and f"{S.FAILURE_PREFIX}.transient.>" not in validator


def test_what_travels_on_a_stream_has_one_and_a_request_none() -> None:
    for c in CHANNELS:
        if c.kind in ("command", "event", "dead_letter"):
            assert c.stream is not None and c.model is not None, c.address
        else:
            assert c.stream is None, c.address
        assert set(c.publishers) and all(p.isidentifier() for p in c.publishers), c.address


def test_covering_patterns_are_dropped_and_only_those() -> None:
    assert covers("a.b.>", "a.b.c.*") and covers("a.*.c", "a.b.c") and covers("a.>", "a.>")
    assert not covers("a.b.*", "a.b.>") and not covers("a.b.c", "a.b.*") and not covers("a.b.>", "a.b")
    escalation = permissions.published("escalation")
    assert f"{S.ESCALATION_EVENT_PREFIX}.>" in escalation
    assert not any(p.startswith(S.ESCALATION_EVENT_PREFIX + ".") and p.endswith(".*") for p in escalation)
