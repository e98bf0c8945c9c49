"""The private nats-py names the bus relies on (``shared.bus.natsx``) exist on the installed nats-py with
the shapes the wrappers assume: a nats-py upgrade that renames or reshapes one fails here, by name."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import nats.aio.client
import pytest
from nats.aio.client import Client
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from shared.bus import natsx
from tests.support.paths import ROOT

OWNERS: dict[str, Any] = {"Client": Client, "JetStreamContext": JetStreamContext, "KeyValue": KeyValue}


def fresh_objects() -> dict[str, Any]:
    """Real nats-py objects, not connected: the instance attributes exist from their constructors."""
    nc = Client()
    js = nc.jetstream()
    kv = KeyValue(name="orders", stream="KV_orders", pre="$KV.orders.", js=js, direct=True)
    return {"Client": nc, "JetStreamContext": js, "KeyValue": kv}


@pytest.mark.parametrize(("owner", "name"), natsx.PRIVATE_NAMES, ids=[f"{o}.{n}" for o, n in natsx.PRIVATE_NAMES])
def test_every_private_name_the_bus_uses_exists_on_the_installed_nats_py(owner: str, name: str) -> None:
    if owner.startswith("nats."):
        assert hasattr(importlib.import_module(owner), name), f"{owner}.{name} is gone from nats-py"
    else:
        assert hasattr(fresh_objects()[owner], name), f"nats-py's {owner} has no {name} any more"


def test_the_private_methods_take_what_natsx_passes() -> None:
    send = inspect.signature(Client._send_command)
    assert list(send.parameters)[:2] == ["self", "cmd"]
    assert all(p.default is not inspect.Parameter.empty for p in list(send.parameters.values())[2:])
    flush = inspect.signature(Client._flush_pending)
    assert all(p.default is not inspect.Parameter.empty for p in list(flush.parameters.values())[1:])
    assert inspect.iscoroutinefunction(Client._send_command)
    assert inspect.iscoroutinefunction(Client._flush_pending)
    assert list(inspect.signature(KeyValue.__init__).parameters) == ["self", "name", "stream", "pre", "js", "direct"]
    assert nats.aio.client.Client.CONNECTED != Client().__dict__["_status"]  # a fresh client is not connected


def test_the_wrappers_read_what_nats_py_keeps() -> None:
    objs = fresh_objects()
    nc, js, kv = objs["Client"], objs["JetStreamContext"], objs["KeyValue"]
    assert natsx.is_connected(nc) is False
    assert natsx.max_payload(nc) > 0
    assert natsx.api_prefix(js) == "$JS.API"
    assert natsx.api_prefix(nc.jetstream(domain="hub")) == "$JS.hub.API"
    assert (natsx.kv_subject_prefix(kv), natsx.kv_stream(kv), natsx.kv_direct(kv)) == ("$KV.orders.", "KV_orders", True)

    async def on_error(err: Exception) -> None:
        return None

    before = natsx.error_callback(nc)
    assert inspect.iscoroutinefunction(before)
    natsx.set_error_callback(nc, on_error)
    assert natsx.error_callback(nc) is on_error
    asyncio.run(natsx.error_callback(nc)(RuntimeError("x")))


def test_the_protocol_rules_are_nats_py_s() -> None:
    assert natsx.header_name_ok("Lw-Run-Id") and natsx.header_name_ok("Nats-Msg-Id")
    assert not natsx.header_name_ok("bad name") and not natsx.header_name_ok("colon:name")
    assert natsx.subject_invalid("a b") and natsx.subject_invalid("a\tb")
    assert not natsx.subject_invalid("cmd.run.submit.default")
    assert natsx.key_valid("run-1.state") and not natsx.key_valid("a b") and not natsx.key_valid("a*")


def test_no_module_but_natsx_touches_a_private_nats_py_name() -> None:
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    attrs = "|".join(sorted({name for owner, name in natsx.PRIVATE_NAMES if not owner.startswith("nats.")}))
    uses = re.compile(rf"(?<!self)\.({attrs})\b|from nats[\w.]* import .*\b_[A-Za-z]")
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for top in ("shared", "services", "loopwarden", "bench")
        for path in sorted((root / top).rglob("*.py"))
        if path.name != "natsx.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if uses.search(line)
    ]
    assert not found, "private nats-py names outside shared/bus/natsx.py:\n" + "\n".join(found)


def test_no_code_lists_a_bucket_with_nats_py_keys() -> None:
    """``KeyValue.keys`` watches the bucket until nothing is pending, and under load it can decide so before the
    first key arrives: a full bucket listed as empty (``NoKeysError``). ``Bus.keys`` asks the server's index."""
    listing = re.compile(r"await [^#\n]*\.keys\(\)")
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for top in ("shared", "services", "loopwarden", "tests", "bench")
        for path in sorted((ROOT / top).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if listing.search(line) and path != Path(__file__)
    ]
    assert found == [], "list a bucket with Bus.keys, not KeyValue.keys:\n" + "\n".join(found)
    assert listing.search("keys = [k for k in await ledger.keys() if k]")
    assert not listing.search("keys = await client.bus.keys(S.KV_RUNS)")
