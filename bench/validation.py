"""Output validation throughput: the validator's path vs a naive ``jsonschema.validate`` call.

Instance: a realistic search-tool output (10 results with title, URL (format uri) and
snippet, plus totalCount) against the registered ``search`` contract (closed objects,
oneOf with a not_found variant). The naive baseline re-checks and recompiles the schema
on every call, which is what "validate the output" looks like without a contract cache.
"""

from __future__ import annotations

import copy
import json
import random
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import validators as js_validators

from shared.contracts.output import check_output
from shared.contracts.registration import load_contract_file, register_contract, validator_for

ROOT = Path(__file__).resolve().parents[1]


def search_contract() -> Any:
    contract, _, _ = load_contract_file(ROOT / "schemas" / "tools" / "search.json")
    return register_contract(contract)


def search_output(n: int = 10) -> dict[str, Any]:
    return {
        "status": "success",
        "totalCount": 137,
        "results": [
            {
                "title": f"Result {i}: JetStream consumers and ack policies",
                "url": f"https://docs.nats.io/nats-concepts/jetstream/consumers#section-{i}",
                "snippet": "A durable pull consumer hands each message to one of the clients that fetch from it. " * 2,
            }
            for i in range(n)
        ],
    }


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second, measured for about ``seconds`` after a warm-up."""
    for _ in range(3):
        fn()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(20):
            fn()
        calls += 20
    return calls / elapsed


def mutations(instance: dict[str, Any], n: int, seed: int = 1) -> list[Any]:
    """Valid and invalid variants of ``instance`` for checking that both engines agree."""
    rng = random.Random(seed)
    out: list[Any] = [copy.deepcopy(instance), {"status": "not_found", "reason": "none"}]
    edits: list[Callable[[dict[str, Any]], None]] = [
        lambda d: d.__setitem__("totalCount", str(d["totalCount"])),
        lambda d: d["results"][0].pop("url"),
        lambda d: d["results"][1].__setitem__("url", "not a uri"),
        lambda d: d.__setitem__("extra", 1),
        lambda d: d.__setitem__("status", "ok"),
        lambda d: d["results"].append({"title": 3, "url": "https://x.y", "snippet": ""}),
        lambda d: d.__setitem__("totalCount", -1),
        lambda d: d["results"][2].__setitem__("score", 0.5),
        lambda d: d.pop("results"),
    ]
    for _ in range(n):
        d = copy.deepcopy(instance)
        for edit in rng.sample(edits, rng.randint(0, 3)):
            try:
                edit(d)
            except (KeyError, IndexError):
                continue  # an earlier edit removed what this one changes
        out.append(d)
    return out


def run(seconds: float = 2.0) -> dict[str, float]:
    contract = search_contract()
    schema = contract.output_schema
    instance = search_output()
    compiled = validator_for(contract, "output")

    disagreements = 0
    reference = js_validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
    for candidate in mutations(instance, 300):
        fast = compiled.is_valid(candidate)
        explained = not compiled.raw_errors(candidate)
        disagreements += fast != explained
    assert reference.is_valid(instance) and compiled.is_valid(instance)

    def naive_validate() -> None:
        jsonschema.validate(instance, schema)

    def cached_python() -> None:
        reference.is_valid(instance)

    def ours_decision() -> None:
        validator_for(contract, "output").is_valid(instance)

    def ours_full() -> None:
        check_output(contract, instance)

    baseline = rate(naive_validate, seconds)
    results = {
        "naive_jsonschema_validate_per_s": baseline,
        "compiled_python_jsonschema_per_s": rate(cached_python, seconds),
        "validator_decision_per_s": rate(ours_decision, seconds),
        "validator_full_check_per_s": rate(ours_full, seconds),
        "engine_disagreements": float(disagreements),
        "instance_bytes": float(len(json.dumps(instance))),
    }
    from shared.contracts.validation import CompiledSchema

    before = rss_kib()
    kept = [CompiledSchema({**schema, "title": f"copy {i}"}, "2020-12") for i in range(200)]
    results["compiled_contract_kib"] = (rss_kib() - before) / len(kept)  # both engines, Rust side included
    return results


def rss_kib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 1024


def report(results: dict[str, float]) -> list[str]:
    base = results["naive_jsonschema_validate_per_s"]
    lines = [
        f"search output, {results['instance_bytes']:.0f} bytes, 10 results:",
        f"  naive jsonschema.validate      {base:>12,.0f} /s   1.0x (baseline)",
        f"  jsonschema, compiled once      {results['compiled_python_jsonschema_per_s']:>12,.0f} /s "
        f"{results['compiled_python_jsonschema_per_s'] / base:6.1f}x",
        f"  validator decision (rs, cached){results['validator_decision_per_s']:>12,.0f} /s "
        f"{results['validator_decision_per_s'] / base:6.1f}x   target >= 30x",
        f"  validator full check_output    {results['validator_full_check_per_s']:>12,.0f} /s "
        f"{results['validator_full_check_per_s'] / base:6.1f}x   (parse, validate, repair narrowly)",
        f"  engines disagree on            {results['engine_disagreements']:.0f} of 302 mutated instances",
        f"  memory per compiled contract   {results['compiled_contract_kib']:.1f} KiB RSS (both engines)",
    ]
    return lines
