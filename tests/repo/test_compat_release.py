"""Every contract and the AsyncAPI document against the last release's (``schemas/releases/<version>``).

The committed contracts are the models' (``tests/repo/test_contracts_drift.py``, ``tests/stack/test_asyncapi.py``),
so comparing the committed files compares what the services speak today.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

from loopwarden.generate.compat import RELEASES, SCHEMAS, Contracts, breaking, compare, releases, report
from shared.version import SERVICE_HEADER, VERSION_HEADER, package_version, version_from_pyproject, version_headers


def test_the_current_contracts_are_compatible_with_the_last_release() -> None:
    known = releases()
    assert known, "no release snapshot in schemas/releases: run `make release-snapshot` on a release version"
    findings = compare(Contracts.load(RELEASES / known[-1]), Contracts.load(SCHEMAS))
    assert breaking(findings) == [], report(findings, known[-1])


def deliberately_broken(tmp: Path) -> Path:
    """A copy of the current contracts with one change of each breaking kind."""
    shutil.copytree(SCHEMAS / "messages", tmp / "messages")
    shutil.copy(SCHEMAS / "asyncapi.json", tmp / "asyncapi.json")
    path = tmp / "messages" / "ToolCall.json"
    call = json.loads(path.read_text())
    call["properties"]["invocation_id"] = call["properties"].pop("call_id")  # renamed
    call["required"] = [("invocation_id" if r == "call_id" else r) for r in call["required"]]
    call["properties"]["iteration"]["maximum"] = 50  # narrowed
    path.write_text(json.dumps(call))
    doc = json.loads((tmp / "asyncapi.json").read_text())
    doc["channels"] = {k: c for k, c in doc["channels"].items() if c["address"] != "lw.v1.cmd.judge.score"}
    doc["operations"] = {
        k: op for k, op in doc["operations"].items() if op["channel"]["$ref"].split("/")[-1] in doc["channels"]
    }
    (tmp / "asyncapi.json").write_text(json.dumps(doc))
    return tmp


def test_the_check_refuses_a_deliberately_breaking_change_naming_the_contract_the_field_and_why(tmp_path: Path) -> None:
    release = releases()[-1]
    findings = compare(Contracts.load(RELEASES / release), Contracts.load(deliberately_broken(tmp_path)))
    message = report(findings, release)
    print(message)
    assert [str(f) for f in breaking(findings)] == [
        "ToolCall.call_id: removed field: an older reader requires it and refuses every message without it "
        "(new writer -> old reader); a rename is a removal plus a new field",
        "ToolCall.iteration: narrowed: maximum none -> 50 (old writer -> new reader)",
        "ToolCall.invocation_id: new required field: an older writer does not send it (old writer -> new reader)",
        "channel lw.v1.cmd.judge.score (receive): removed subject: a service of the last release still consumes it; "
        "serve lw.v<n+1> beside it for a release first",
        "channel lw.v1.cmd.judge.score (send): removed subject: a service of the last release still publishes on it; "
        "serve lw.v<n+1> beside it for a release first",
    ], message
    assert message.startswith(f"5 contract change(s) the release {release} services cannot handle:")


def test_every_release_in_releases_toml_has_its_contracts_and_every_snapshot_is_a_release() -> None:
    listed = tomllib.loads((RELEASES.parents[1] / "releases.toml").read_text())["release"]
    assert [r["version"] for r in listed] == releases(), "releases.toml and schemas/releases disagree"
    assert all(len(r["commit"]) == 40 for r in listed), listed
    assert package_version() not in releases() or package_version() == releases()[-1]


# --- the version a process announces ----------------------------------------------------------------------------


def test_a_source_tree_announces_the_version_of_its_own_pyproject(tmp_path: Path) -> None:
    here = version_from_pyproject(Path(__file__).resolve().parents[2] / "pyproject.toml")
    assert here is not None and package_version() == here
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "loopwarden"\nversion = "9.8.7"\n')
    assert version_from_pyproject(tmp_path / "pyproject.toml") == "9.8.7"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "someone-else"\nversion = "1.0"\n')
    assert version_from_pyproject(tmp_path / "pyproject.toml") is None  # not ours: the metadata decides
    assert version_from_pyproject(tmp_path / "missing.toml") is None


def test_every_published_message_names_its_release_and_service() -> None:
    assert version_headers("planner") == {VERSION_HEADER: package_version(), SERVICE_HEADER: "planner"}
