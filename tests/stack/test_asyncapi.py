"""The AsyncAPI document: generated from the handlers by FastStream, checked in, served by the console."""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from functools import cache
from typing import Any
from urllib.parse import unquote

import pytest

from loopwarden.generate import asyncapi
from loopwarden.generate.messages import CATALOGUE
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.messages import WIRE_MODELS
from tests.support.paths import ROOT
from tests.support.timing import bound


@cache
def document() -> dict[str, Any]:
    return json.loads(asyncapi.render())


def resolve(doc: dict[str, Any], ref: str) -> Any:
    node: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[unquote(part).replace("~1", "/").replace("~0", "~")]
    return node


def payload_of(doc: dict[str, Any], channel: dict[str, Any]) -> set[str]:
    """The schema names a channel's messages carry."""
    names = set()
    for message in channel["messages"].values():
        payload = resolve(doc, message["$ref"])["payload"]
        names.add(payload["$ref"].rsplit("/", 1)[-1])
    return names


def test_asyncapi_document_matches_the_handlers() -> None:
    wanted = asyncapi.render()
    on_disk = asyncapi.OUT.read_text() if asyncapi.OUT.is_file() else ""
    if on_disk != wanted:
        diff = difflib.unified_diff(
            on_disk.splitlines(), wanted.splitlines(), "schemas/asyncapi.json (committed)", "generated", lineterm=""
        )
        raise AssertionError(
            "schemas/asyncapi.json drifted from the handlers; run `make schemas` and review:\n"
            + "\n".join(list(diff)[:80])
        )


def test_every_consumed_channel_carries_its_typed_contract() -> None:
    doc = document()
    assert doc["asyncapi"] == "3.0.0"
    channels = doc["channels"]
    schemas = doc["components"]["schemas"]
    by_name = {m.__name__: m for m in WIRE_MODELS}
    # what each service's build registered on the bus is a channel with the contract it decodes
    for service, found in asyncapi.declared().services.items():
        for d in found:
            for subject in d.subjects:
                found = [c for c in channels.values() if c["address"] == subject and d.service in c["description"]]
                assert found, f"{service}: {subject} is not a channel"
                assert payload_of(doc, found[0]) == {d.model.__name__}, (subject, payload_of(doc, found[0]))
    # no empty bodies: each payload is the wire model's own schema
    for channel in channels.values():
        for name in payload_of(doc, channel):
            assert name in by_name, f"{channel['address']}: payload {name} is no wire model"
            own = by_name[name].model_json_schema(by_alias=True)
            if "oneOf" in own:  # a union of typed members (RunEvent): every member is there
                assert len(schemas[name]["oneOf"]) == len(own["oneOf"]) > 1
                assert all(m["$ref"].rsplit("/", 1)[-1] in schemas for m in schemas[name]["oneOf"])
            else:
                assert schemas[name]["type"] == "object"
                assert set(schemas[name]["properties"]) == set(own["properties"])
    # channel parameters are declared, as AsyncAPI 3 requires for {expressions}
    run_events = next(c for c in channels.values() if c["address"] == f"{S.RUN_EVENT_PREFIX}.{{kind}}.{{run}}")
    assert set(run_events["parameters"]) == {"kind", "run"}
    # request/reply subjects name their queue group (an operation binding) and their reply contract
    reserve = next(o for o in doc["operations"].values() if o["channel"]["$ref"].endswith("lw-v1-rpc-budget-reserve"))
    assert reserve["bindings"] == {"nats": {"queue": "governor", "bindingVersion": "0.1.0"}}
    assert [r["$ref"] for r in reserve["x-reply"]["payload"]["oneOf"]] == [
        "#/components/schemas/BudgetDecision",
        "#/components/schemas/ErrorReply",
    ]


def test_the_document_is_valid_asyncapi_3() -> None:
    """Parsed by an independent AsyncAPI 3.0 object model (identifiers, bindings, extensions), and
    every internal reference resolves."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the model's own field-shadowing warnings
        from asyncapi3.models.asyncapi import AsyncAPI3

    doc = document()
    parsed = AsyncAPI3.model_validate(doc)
    assert len(parsed.channels or {}) == len(doc["channels"])
    refs: list[str] = []

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "$ref" and isinstance(v, str):
                    refs.append(v)
                else:
                    collect(v)
        elif isinstance(node, list):
            for item in node:
                collect(item)

    collect(doc)
    assert len(refs) > 100
    for ref in refs:
        resolve(doc, ref)  # a KeyError names the dangling reference
    # and the model does reject what the spec does: FastStream's raw keys (subjects with ':' and '>')
    raw = json.loads(json.dumps(doc))
    raw["channels"]["planner:lw.v1.evt.tool.succeeded.>"] = raw["channels"].popitem()[1]
    with pytest.raises(ValueError):
        AsyncAPI3.model_validate(raw)


def _pattern(subject: str) -> list[str]:
    return re.sub(r"<[^>]*>|\{\w+\}", "*", subject).split(".")


def _matches(a: list[str], b: list[str]) -> bool:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if ">" in (x, y):
            return True
        if x != y and "*" not in (x, y):
            return False
        if i == len(a) - 1 or i == len(b) - 1:
            return len(a) == len(b)
    return len(a) == len(b)


def test_every_catalogue_subject_is_a_channel_with_its_contract() -> None:
    doc = document()
    missing = []
    for key, contract in CATALOGUE.items():
        if key.startswith("kv "):
            continue  # a bucket, not a channel
        subject = re.sub(r"<[^>]*>", "*", key).removesuffix(" (request/reply)").split("|")[0]
        request, _, replies = contract.partition(" -> ")
        request = request.split(" ", 1)[0]  # "RunEvent (the member whose kind is <kind>)" -> RunEvent
        candidates = [
            c
            for c in doc["channels"].values()
            if _matches(_pattern(subject), _pattern(c["address"])) and request in payload_of(doc, c)
        ]
        if not candidates:
            missing.append(f"{key}: {contract}")
            continue
        if replies:
            ops = [o for o in doc["operations"].values() if "x-reply" in o]
            reply_names = {
                ref["$ref"].rsplit("/", 1)[-1]
                for o in ops
                if resolve(doc, o["channel"]["$ref"]) in candidates
                for ref in o["x-reply"]["payload"]["oneOf"]
            }
            assert set(replies.split(" | ")) <= reply_names, (key, reply_names)
    assert not missing, "catalogue subjects without a channel carrying their contract:\n" + "\n".join(missing)


def test_the_console_serves_the_document(stack: LocalStack) -> None:
    env = {
        **os.environ,
        "LW_NATS_URL": stack.nats_url,
        "LW_CONSOLE_PORT": "0",
        "LW_CONSOLE_HOST": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopwarden.console"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + bound(60)
        url = ""
        while time.monotonic() < deadline and not url:
            line = proc.stdout.readline()
            if not line:
                break
            if "ready on " in line:
                url = line.split("ready on ", 1)[1].strip()
        assert url, "the console did not start"
        with urllib.request.urlopen(f"{url}/asyncapi.json", timeout=bound(10)) as resp:
            assert resp.headers["content-type"].startswith("application/json")
            served = json.loads(resp.read())
        assert served == json.loads(asyncapi.OUT.read_text())
        with urllib.request.urlopen(f"{url}/login", timeout=bound(10)) as resp:
            assert 'href="/asyncapi.json"' in resp.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=bound(20))
