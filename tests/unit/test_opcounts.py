"""What a benchmark counts per step: each subject the bus sends a request on is one kind of operation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shared import opcounts
from shared import subjects as S


@pytest.mark.parametrize(
    ("subject", "kind"),
    [
        (f"{S.P}.cmd.tool.execute.calculator", "publish"),
        (f"{S.P}.evt.run.model_called.run-1", "publish"),
        (f"$KV.{S.KV_RUNS}.run-1", "kv_put"),
        (f"$JS.API.DIRECT.GET.KV_{S.KV_RUNS}.$KV.{S.KV_RUNS}.run-1", "kv_get"),
        (f"$JS.API.DIRECT.GET.{S.STREAM_DLQ}", "direct_get"),
        ("$JS.API.DIRECT.GET.LW_PAYLOADS.lw.v1.payload.planner.abc.0", "payload_fetch"),
        (f"{S.P}.payload.planner.abc.0", "payload_put"),
        ("$JS.API.CONSUMER.MSG.NEXT.LW_CMD.executor_calculator", "pull"),
        ("$JS.API.CONSUMER.INFO.LW_CMD.executor_calculator", "js_api"),
        (f"$JS.API.STREAM.MSG.DELETE.{S.STREAM_CMD}", "remove"),
    ],
)
def test_a_subject_is_one_kind_of_operation(subject: str, kind: str) -> None:
    assert opcounts.kind_of(subject) == kind


def test_the_counts_are_written_whole_for_a_benchmark_to_read(tmp_path: Path) -> None:
    before = dict(opcounts.COUNTS)
    try:
        opcounts.note(f"$KV.{S.KV_RUNS}.run-1")
        opcounts.count("rpc", 2)
        path = opcounts.dump(str(tmp_path), "planner")
        written = json.loads(path.read_text())
        assert path.name == f"planner-{os.getpid()}.json" and written["service"] == "planner"
        assert written["counts"]["kv_put"] == before.get("kv_put", 0) + 1
        assert written["counts"]["rpc"] == before.get("rpc", 0) + 2
        assert list(tmp_path.iterdir()) == [path]  # no temporary file left beside it
    finally:
        opcounts.COUNTS.clear()
        opcounts.COUNTS.update(before)
