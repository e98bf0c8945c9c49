"""The front door from Python and from `submit --wait` (issue 24, items 1, 4 and 5).

- One public API: every name a user needs comes from `loopwarden` (the wheel's side is in
  tests/own/test_cli_lifecycle.py's wheel test); docs/embedding.md's code runs as written.
- The client finds the server as the CLI does (environment, then the stack `loopwarden up` recorded)
  and its connect is bounded: one error naming the URL (never its password), not a hang.
- `submit --wait` prints the run id first and exits 5 as soon as the run waits for a human, whatever
  the scenario's `expect` says.

All against the session's real stack (conftest `stack`) and the real `loopwarden` command.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopwarden.stack import LocalStack, free_port
from tests.support.paths import ROOT
from tests.support.timing import bound

DEMO = ROOT / "scenarios" / "demo.yaml"
ESCALATES = ROOT / "scenarios" / "correction-escalates.yaml"  # shipped; its run waits for a human


def _env(**extra: str) -> dict[str, str]:
    drop = ("NATS_URL", "LW_NATS_URL", "LW_STATE_DIR", "XDG_STATE_HOME", "PYTHONIOENCODING", "LW_NATS_PASSWORD")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def _lw(*args: str, env: dict[str, str], timeout: float = bound(120)) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def _abort(stack: LocalStack, run_id: str) -> None:
    """Leave no run waiting in the session's shared queue."""
    from loopwarden import Client, Settings

    async with Client(Settings(nats_url=stack.nats_url)) as client:
        for item in (await client.escalations(run_id=run_id)).escalations:
            await client.resolve(item.escalation_id, who="tests", action="abort", note="test over")


# --- 1. one public API ----------------------------------------------------------------------------
def test_every_public_name_imports_from_loopwarden_and_is_the_internal_one() -> None:
    import loopwarden
    from loopwarden import Client, ToolContext, ToolFailure, load_scenario, tool  # the documented spelling
    from loopwarden.client import Client as InternalClient
    from shared import messages, scenario, tools

    assert loopwarden.__all__ and len(set(loopwarden.__all__)) == len(loopwarden.__all__)
    missing = [name for name in loopwarden.__all__ if getattr(loopwarden, name, None) is None]
    assert not missing, missing
    # the author's API the executor reads, not copies: a tool declared with them is the executor's
    assert (tool, ToolFailure, ToolContext) == (tools.tool, tools.ToolFailure, tools.ToolContext)
    assert Client is InternalClient and load_scenario is scenario.load_scenario
    assert loopwarden.RunSnapshot is messages.RunSnapshot
    star: dict[str, object] = {}
    exec("from loopwarden import *", star)  # what `import *` gives is the contract
    assert set(loopwarden.__all__) <= set(star)
    with pytest.raises(AttributeError, match="no attribute 'shared'"):
        loopwarden.shared  # noqa: B018 - internal modules are not part of the API


def test_importing_loopwarden_stays_quick() -> None:
    """`loopwarden --help` must not pay for the client: the names load on first use."""
    code = "import sys, loopwarden; print(sorted(m for m in ('nats', 'loopwarden.client') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


# --- 2. the client finds the server as the CLI does, and its connect is bounded ----------------------
async def test_a_client_without_settings_uses_the_stack_loopwarden_up_recorded(
    stack: LocalStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopwarden import Client, load_scenario

    for name in ("LW_NATS_URL", "NATS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LW_STATE_DIR", str(tmp_path))
    LocalStack(state_dir=tmp_path / "stack", nats_url=stack.nats_url).save(tmp_path / "stack.json")  # as `up` does
    async with asyncio.timeout(bound(60)), Client() as client:
        assert client.settings.nats_url == stack.nats_url
        state = await client.run_scenario(load_scenario(DEMO), timeout=bound(50))
    assert state.status == "completed", state.final_reason
    assert state.run_id.startswith("run-") and state.final_output


async def test_nothing_listening_is_one_error_naming_the_url_within_seconds_never_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopwarden import Client, Settings, Unreachable

    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    for name in ("LW_NATS_URL", "NATS_URL", "LW_NATS_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LW_STATE_DIR", str(tmp_path))

    async def refused(client: Client) -> str:
        started = time.monotonic()
        with pytest.raises(Unreachable) as caught:
            async with asyncio.timeout(bound(20)):  # without the bound, nats-py retries forever
                async with client:
                    pass
        assert time.monotonic() - started < bound(8), f"took {time.monotonic() - started:.1f}s"
        message = str(caught.value)
        assert "\n" not in message and "cannot reach NATS at nats://" in message
        return message

    # explicit settings: the URL named, its password not
    said = await refused(Client(Settings(nats_url=f"nats://alice:s3cret-pw@{dead}")))
    assert f"nats://{dead}" in said and "s3cret" not in said and "alice" not in said, said
    # the environment, with the password in its own setting
    monkeypatch.setenv("LW_NATS_URL", f"nats://{dead}")
    monkeypatch.setenv("LW_NATS_PASSWORD", "s3cret-pw")
    said = await refused(Client())
    assert f"nats://{dead}" in said and "s3cret" not in said, said
    # the recorded stack, once it is gone: where the URL came from is said
    monkeypatch.delenv("LW_NATS_URL")
    LocalStack(state_dir=tmp_path / "stack", nats_url=f"nats://{dead}").save(tmp_path / "stack.json")
    said = await refused(Client())
    assert f"nats://{dead} (the stack `loopwarden up` recorded in {tmp_path / 'stack.json'})" in said, said


async def test_the_environment_wins_over_the_recorded_stack(
    stack: LocalStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopwarden import Client, Unreachable

    dead = f"nats://127.0.0.1:{free_port()}"
    monkeypatch.setenv("LW_STATE_DIR", str(tmp_path))
    LocalStack(state_dir=tmp_path / "stack", nats_url=stack.nats_url).save(tmp_path / "stack.json")
    monkeypatch.setenv("LW_NATS_URL", dead)
    with pytest.raises(Unreachable, match=re.escape(dead)):
        async with asyncio.timeout(bound(20)), Client():
            pass


# --- 3. submit --wait: the run id first, 5 at once for a human ------------------------------------
@pytest.mark.parametrize("expect", ["shipped", "completed"])
def test_submit_wait_prints_the_run_id_first_and_exits_5_at_once_when_the_run_waits_for_a_human(
    stack: LocalStack, tmp_path: Path, expect: str
) -> None:
    """Whatever `expect` says: the shipped one (awaiting_human), or one that wanted the run to complete
    (it used to wait out its whole --timeout and exit 4 "timed out")."""
    scenario = ESCALATES
    if expect == "completed":
        scenario = tmp_path / "wants-completed.yaml"
        text = ESCALATES.read_text().replace("expect: {status: awaiting_human", "expect: {status: completed")
        assert "status: completed" in text
        scenario.write_text(text)
    env = _env(LW_NATS_URL=str(stack.nats_url), LW_STATE_DIR=str(tmp_path))
    started = time.monotonic()
    done = _lw("submit", "--scenario", str(scenario), "--wait", "--timeout", f"{bound(60):g}", env=env)
    took = time.monotonic() - started
    lines = done.stdout.splitlines()
    assert done.returncode == 5, done.stdout + done.stderr
    assert took < bound(30), f"waited {took:.0f}s: it waited for the run to end, not for the human"
    assert re.fullmatch(r"run-[0-9a-f]+", lines[0]), lines
    assert lines[1].startswith("awaiting_human: escalation "), lines
    if expect == "completed":
        assert "EXPECTATION NOT MET: status: expected completed, got awaiting_human" in done.stderr, done.stderr
    else:
        assert "EXPECTATION NOT MET" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    asyncio.run(_abort(stack, lines[0]))


def test_a_wait_that_times_out_has_printed_the_run_id_first(stack: LocalStack, tmp_path: Path) -> None:
    env = _env(LW_NATS_URL=str(stack.nats_url), LW_STATE_DIR=str(tmp_path))
    done = _lw("submit", "--scenario", str(DEMO), "--wait", "--timeout", "0.1", env=env)
    assert done.returncode == 4, done.stdout + done.stderr
    (run_id,) = done.stdout.splitlines()
    assert run_id.startswith("run-") and f"`loopwarden status {run_id}`" in done.stderr, done.stderr


# --- 4. the README's and the embedding page's code runs as written ---------------------------------
def _python_blocks(page: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (ROOT / page).read_text(), re.M | re.S)


PAGES = ("README.md", "docs/embedding.md")
BLOCKS = [(page, i, code) for page in PAGES for i, code in enumerate(_python_blocks(page))]


def test_the_embedding_page_has_code() -> None:
    assert len(_python_blocks("docs/embedding.md")) >= 4 and _python_blocks("README.md")


@pytest.mark.parametrize(("page", "index", "code"), BLOCKS, ids=[f"{p}-{i}" for p, i, _ in BLOCKS])
def test_the_docs_python_runs_as_written(stack: LocalStack, tmp_path: Path, page: str, index: int, code: str) -> None:
    """Each block in its own interpreter, from the repository root, pointed at the stack as a user's shell
    would be (LW_NATS_URL); nothing it imports is internal."""
    assert not re.search(r"^\s*(from|import) (shared|services)\b", code, re.M), code
    env = _env(LW_NATS_URL=str(stack.nats_url), LW_STATE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=bound(120)
    )
    assert done.returncode == 0, f"{page} block {index}:\n{code}\n{done.stdout}{done.stderr}"
    print(done.stdout)
