"""The generated contracts in schemas/messages/ match the wire models (run `make schemas`)."""

from __future__ import annotations

import difflib

from loopwarden.generate.messages import OUT, render


def test_message_schemas_match_the_models() -> None:
    wanted = render()
    on_disk = {p.name: p.read_text() for p in OUT.glob("*.json")}
    problems = []
    for name in sorted(set(wanted) | set(on_disk)):
        if name not in on_disk:
            problems.append(f"missing schemas/messages/{name}")
        elif name not in wanted:
            problems.append(f"stale schemas/messages/{name} (no model generates it)")
        elif on_disk[name] != wanted[name]:
            diff = difflib.unified_diff(
                on_disk[name].splitlines(),
                wanted[name].splitlines(),
                f"schemas/messages/{name} (committed)",
                f"{name} (from models)",
                lineterm="",
            )
            problems.append("\n".join(list(diff)[:60]))
    assert not problems, "contracts drifted from the models; run `make schemas` and review:\n" + "\n\n".join(problems)
