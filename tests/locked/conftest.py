"""The locked deployment: a private nats-server running the generated ``deploy/nats/auth.conf``, bootstrapped as
admin, every service as its own NATS user (``tests/support/locked.py``). ``locked`` is defined here and nowhere
else, and is always a ``Deployment`` (its ``url``, ``stack``, ``settings(user)``, ``cli(user, ...)``): the session's,
as production runs it, or, for a module that declares ``LOCKED = OwnLocked(...)``, that module's own locked stack,
started once for the module (``tests/repo/test_suite_shape.py`` fails on a module defining ``locked``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from shared.settings import Settings
from tests.support import locked as L
from tests.support.locked import Deployment, OwnLocked, locked_deployment
from tests.support.stacks import TEST_ENV


@pytest.fixture(scope="session")
def production_deployment(tmp_path_factory: pytest.TempPathFactory, messages_api: FakeModel) -> Iterator[Deployment]:
    """The session's locked deployment, as production runs it: every service and the console as its own NATS user,
    scripted runs off, the model the session's Messages API; people act as their users. Tests ask for ``locked``."""
    env = {**TEST_ENV, "LW_TENANT_CEILINGS": '{"default": 1000, "acme": 1000}'}
    with locked_deployment(tmp_path_factory.mktemp("locked"), env, messages_api.base_url) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def locked(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The module's locked deployment: its own (``LOCKED = OwnLocked(...)`` in the module) or the session's."""
    own: OwnLocked | None = getattr(request.module, "LOCKED", None)
    if own is None:
        yield request.getfixturevalue("production_deployment")
        return
    model_url = request.getfixturevalue(own.model).base_url if own.model else ""
    with own.deployment(tmp_path_factory.mktemp(own.name), model_url) as deployment:
        yield deployment


def _client_as(url: str, user: str, **overrides: str) -> Settings:
    return L.as_user(url, user, manage_streams=False, rpc_timeout_s=3, **overrides)


@pytest.fixture
async def locked_client(locked: Deployment) -> AsyncIterator[Client]:
    """A client of the default tenant (NATS user ``client``) on the module's locked deployment."""
    async with Client(_client_as(locked.url, "client"), identity="client") as c:
        yield c


@pytest.fixture
async def acme(locked: Deployment) -> AsyncIterator[Client]:
    """A client of tenant ``acme`` (NATS user ``client_acme``) on the module's locked deployment."""
    async with Client(_client_as(locked.url, "client_acme", tenant="acme"), identity="client_acme") as c:
        yield c
