"""What every folder of the suite shares: the pytest hooks (stragglers, the time scale, service logs on a failure)
and the session-wide in-test servers more than one folder's modules use: the OTLP collector (``otlp``), the
Messages-API stand-in (``messages_api``) and the client's telemetry (``client_telemetry``).

The folder says what a module starts (docs/contributing.md, "The test suite"): ``unit/`` and ``repo/`` no server;
``stack/`` the session stack (its conftest owns ``stack`` and ``client``); ``locked/`` the generated auth.conf
enforced (its conftest owns ``locked``); ``own/`` processes of the module's own, in fixtures named for what they
are. Helpers live in ``tests/support/``; a module imports nothing from a conftest (``tests/repo/test_suite_shape.py``).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopwarden.fake_model import FakeModel
from loopwarden.stack import LocalStack, tail
from shared import gc_policy
from shared.settings import Settings
from shared.telemetry import Telemetry, setup_telemetry
from tests.support import stragglers
from tests.support.otlp_collector import OtlpCollector
from tests.support.stragglers import pytest_sessionfinish, pytest_terminal_summary  # noqa: F401 (hooks)
from tests.support.timing import bound, scale_test_timeout

# The order test modules are handed to the workers (``make test``: ``--dist loadfile``): the folders whose modules
# start processes of their own first, the pure ones last. xdist's default hands out the modules with the most tests
# first, which left the suite's longest modules (a few tests each: a rolling upgrade, chaos, a cluster) to the end,
# one worker running them while the other had nothing left; unit tests at the end fill the gaps instead.
FOLDERS_FIRST_TO_LAST = ("own", "locked", "stack", "repo", "unit")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    stragglers.pytest_configure(config)  # a run id every process the run starts inherits
    scale_test_timeout(config)
    gc_policy.set_thresholds()  # as a service's: importing the test modules is most of a worker's start
    if hasattr(config.option, "loadscopereorder"):  # xdist: hand out the modules in the collected order
        config.option.loadscopereorder = False
    # every stack the run starts, in this process or a CLI's, waits for readiness on the same scale
    os.environ.setdefault("LW_STACK_READY_TIMEOUT_S", f"{bound(60):g}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules of ``own/`` first, then ``locked/``, ``stack/``, ``repo/``, ``unit/`` (``FOLDERS_FIRST_TO_LAST``); the
    order within a folder, and of the tests within a module, stays as collected."""

    tests = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        return FOLDERS_FIRST_TO_LAST.index(folder) if folder in FOLDERS_FIRST_TO_LAST else len(FOLDERS_FIRST_TO_LAST)

    items.sort(key=rank)


def pytest_collection_finish() -> None:
    """The test modules, the tree they imported and pytest's items live until the run ends: out of every later
    collection, as a service freezes what it built (``shared/service.py``)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def otlp() -> Iterator[OtlpCollector]:
    collector = OtlpCollector().start()
    yield collector
    collector.stop()


@pytest.fixture(scope="session")
def messages_api() -> Iterator[FakeModel]:
    server = FakeModel().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def client_telemetry(otlp: OtlpCollector) -> Telemetry:
    return setup_telemetry("client", Settings(otel_exporter_otlp_endpoint=otlp.endpoint))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        # whichever stack the test used, the session's or its module's own (each named for what it starts)
        funcargs: dict[str, object] = getattr(item, "funcargs", {})
        stacks = [v for v in funcargs.values() if isinstance(v, LocalStack)]
        stacks += [s for v in funcargs.values() if isinstance(s := getattr(v, "stack", None), LocalStack)]
        for st in stacks:
            logs = "\n".join(tail(p.log, 25) for p in st.procs)
            report.sections.append(("service logs (tail)", logs))
