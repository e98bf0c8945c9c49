"""Generate ``schemas/records/RunRecord.json``, the JSON Schema of a run's export (``shared.records.RunRecord``);
``tests/stack/test_records.py`` fails when the model and the file disagree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loopwarden.generate import SCHEMAS
from shared.records import RunRecord
from shared.subjects import VERSION

OUT = SCHEMAS / "records" / "RunRecord.json"


def record_schema() -> str:
    schema: dict[str, Any] = RunRecord.model_json_schema(by_alias=True)
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://loopwarden.dev/schemas/{VERSION}/records/RunRecord.json",
        **schema,
    }
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write() -> list[Path]:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(record_schema())
    return [OUT]
