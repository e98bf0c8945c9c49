"""Tenants and operators are configuration (``shared/access.py``): the access file, its refusals, and what it
changes in the generated grants - a person's own user, never a service's grant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest

from loopwarden.auth_conf import auth_conf
from loopwarden.generate.auth_conf import EXAMPLE_FILE, OUT
from shared import subjects as S
from shared.access import EXAMPLE, AccessError, AccessFile, load_access, parse_access
from shared.permissions import grants, render, rights
from tests.support.paths import ROOT

HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
MORE = {
    "tenants": {
        "acme": {"users": {"client_acme": {}}},
        "globex": {"users": {"globex_web": {"password_hash": HASH}, "globex_batch": None}, "policy": {"weight": 3}},
    },
    "operators": {
        "alice": {"kinds": ["*"], "agents": "all"},
        "bob": {"kinds": ["not_judged", "approval", "spawn"], "agents": "own"},
        "carol": {"kinds": ["fatal"], "password_hash": HASH, "console_password_hash": HASH},
    },
}


def test_the_shipped_example_file_is_the_example_the_shipped_auth_conf_comes_from() -> None:
    assert load_access(EXAMPLE_FILE) == EXAMPLE
    assert OUT.read_text() == auth_conf(EXAMPLE)


def test_adding_tenants_and_operators_changes_no_services_grant() -> None:
    before, after = grants(["calculator"], EXAMPLE), grants(["calculator"], parse_access(MORE))
    for user in S.BUILT_IN_USERS:
        if user in before:
            assert rights(user, before[user]) == rights(user, after[user]), user
    assert set(after) - set(before) == {"globex_web", "globex_batch", "carol"}
    pub, sub = rights("globex_web", after["globex_web"])
    assert sub == ["_INBOX_tenant.globex_web.>"]
    assert S.run_submit("globex") in pub and S.run_submit("acme") not in pub
    assert f"$JS.API.DIRECT.GET.{S.STREAM_PAYLOADS}.{S.PAYLOAD_PREFIX}.tenant.globex.>" in pub
    assert not any("tenant.acme" in p for p in pub)
    pub, sub = rights("carol", after["carol"])
    # an operator reads every run's live events as well (``wait``), as the console does
    assert sub == ["_INBOX_operator.carol.>", f"{S.P}.evt.>"] and S.escalation_rpc("claim", "carol") in pub


def test_a_password_hash_in_the_file_is_the_users_password_else_the_environment() -> None:
    text = render(["calculator"], parse_access(MORE))
    assert f'{{ user: "globex_web", password: "{HASH}"' in text
    assert '{ user: "globex_batch", password: $LW_NATS_PASSWORD_GLOBEX_BATCH' in text
    assert '{ user: "planner", password: $LW_NATS_PASSWORD_PLANNER' in text


def test_the_applied_record_and_the_console_logins_come_from_the_file() -> None:
    access = parse_access(MORE)
    record = access.record("admin")
    assert record.tenant_users == {"client_acme": "acme", "globex_web": "globex", "globex_batch": "globex"}
    assert record.tenants["globex"].weight == 3 and record.roster()["carol"] == ["fatal"]
    assert record.operators["bob"].agents == "own" and record.operators["carol"].agents == "none"
    assert access.console_record().users == {"carol": HASH}
    assert "password" not in record.model_dump_json()  # the NATS hashes stay in auth.conf


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"tenants": {"acme": {"users": {"planner": {}}}}}, "tenants.acme.users.planner: 'planner' is a built-in"),
        ({"tenants": {"acme": {"users": {"tenant": {}}}}}, "'tenant' is a built-in or reserved name"),
        ({"operators": {"operator": {}}}, "'operator' is a built-in or reserved name"),
        ({"tenants": {"a": {"users": {"x": {}}}}, "operators": {"x": {}}}, "user 'x' is declared twice"),
        ({"tenants": {"default": {"users": {"x": {}}}}}, "the default tenant's client is the built-in `client`"),
        ({"operators": {"x": {"kinds": ["nope"]}}}, "operators.x.kinds: unknown kind 'nope'"),
        ({"operators": {"x": {"agents": "some"}}}, "operators.x.agents"),
        ({"operators": {"x": {"password_hash": "secret"}}}, "operators.x.password_hash: not a bcrypt hash"),
        ({"operatrs": {}}, "operatrs: Extra inputs are not permitted"),
        ({"services": {"bob": {}}}, "services.bob: not a built-in user"),
        ({"tenants": {"a.b": {}}}, "tenants.a.b"),
        ({"tenants": {"a": {"policy": {"weight": -1}}}}, "tenants.a.policy.weight"),
        ([1, 2], "is a mapping"),
    ],
)
def test_a_bad_access_file_is_refused_naming_the_field(data: object, said: str) -> None:
    with pytest.raises(AccessError) as err:
        parse_access(data, "access.yaml")
    assert said in str(err.value) and str(err.value).startswith("access.yaml")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"tenants: [", "not valid YAML"),
        (b"\xff\xfe tenants", "not UTF-8 text"),
        (b"[" * 100_000, "not valid YAML"),
        (b"a: &a [*a, *a]\n" + b"b: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ],
)
def test_a_hostile_access_file_ends_in_one_line(tmp_path: Path, content: bytes, said: str) -> None:
    path = tmp_path / "access.yaml"
    path.write_bytes(content)
    with pytest.raises(AccessError) as err:
        load_access(path)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_config_apply_writes_a_deployments_auth_conf_where_told_and_leaves_the_shipped_one(tmp_path: Path) -> None:
    """An admin's auth.conf (``loopwarden config apply FILE --auth-conf PATH``): the file's people in it, readable
    by owner and group only; the shipped ``deploy/nats/auth.conf`` (``make schemas``) untouched."""
    import os

    before = OUT.read_bytes()
    access, out = tmp_path / "access.yaml", tmp_path / "etc" / "auth.conf"
    access.write_text("operators: {carol: {kinds: [fatal]}}\n")
    env = {**os.environ, "LW_STATE_DIR": str(tmp_path / "state")}  # no recorded stack: nothing to reload
    run = subprocess.run(
        [
            str(Path(sys.executable).parent / "loopwarden"),
            "config",
            "apply",
            str(access),
            "--auth-conf",
            str(out),
            "--no-store",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert '{ user: "carol"' in out.read_text() and OUT.read_bytes() == before
    assert oct(out.stat().st_mode & 0o777) == "0o640"
    assert "KV_lw_runs" not in out.read_text().split('user: "escalation"')[1].split("{ user:")[0]
    # while the last release's replicas run beside the new ones: the reads this release retired are kept
    again = subprocess.run([*run.args, "--upgrading"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert "KV_lw_runs" in out.read_text().split('user: "escalation"')[1].split("{ user:")[0]


def test_the_access_file_schema_is_the_models() -> None:
    from loopwarden.generate.files import render as schema

    assert (ROOT / "schemas" / "access.json").read_text() == schema("access.json")
    assert isinstance(EXAMPLE, AccessFile)


def test_only_the_console_reads_the_console_logins_and_no_person_reads_lw_config() -> None:
    """``lw_config/console`` holds bcrypt hashes: the console's read alone; the roster and policies
    (``lw_config/access``) are read by the services that act on them, and by no person."""
    from shared.permissions import GRANTS

    every = grants(["calculator"], parse_access(MORE))
    for user, grant in every.items():
        pub, _ = rights(user, grant)
        reads = {p.rsplit(".", 1)[-1] for p in pub if p.startswith(f"$JS.API.DIRECT.GET.KV_{S.KV_CONFIG}")}
        assert f"$JS.API.DIRECT.GET.KV_{S.KV_CONFIG}" not in pub, user  # no batch read: it names any key
        if user == "console":
            assert reads == {S.CONFIG_ACCESS, S.CONFIG_CONSOLE}
        elif user in ("planner", "governor", "escalation"):
            assert reads == {S.CONFIG_ACCESS}, user
        else:
            assert not reads and not any(S.KV_CONFIG in p for p in pub), user
    assert "admin" not in GRANTS  # the admin's rights are the whole account's (it applies the file)


def test_a_generated_password_is_read_by_nats_server_as_a_string() -> None:
    """``up --locked`` hands its passwords to nats-server by environment: one starting with ``-`` (or a digit and
    ``-``) is parsed as a number there and the server does not start (seen: "Expected a digit but got 'y'")."""
    from loopwarden.locked import new_password

    made = [new_password() for _ in range(2000)]
    assert all(p[0].isalpha() and len(p) >= 24 for p in made) and len(set(made)) == len(made)
