"""The release a process runs, and how it announces it (``docs/upgrades.md``).

One source: ``version`` in ``pyproject.toml``. A source tree (a checkout, or a release unpacked
with ``git archive`` beside the current one) reads it from the ``pyproject.toml`` next to its own
packages, so two releases sharing one virtualenv each announce their own; an installed wheel has
no ``pyproject.toml`` and reads the version from its metadata. Every service announces it in its
health endpoint, in its spans' resource (``service.version``) and in two headers on every message
it publishes (``Lw-Version``, ``Lw-Service``).
"""

from __future__ import annotations

import functools
import tomllib
from importlib import metadata
from pathlib import Path

DIST = "loopwarden"
UNKNOWN = "0+unknown"
VERSION_HEADER = "Lw-Version"
SERVICE_HEADER = "Lw-Service"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def version_from_pyproject(path: Path) -> str | None:
    """``project.version`` of ``path`` if it is this project's ``pyproject.toml``; None otherwise."""
    try:
        project = tomllib.loads(path.read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    found = project.get("version")
    return found if project.get("name") == DIST and isinstance(found, str) and found else None


@functools.cache
def package_version() -> str:
    """This tree's release: its ``pyproject.toml`` first (the installed metadata of an editable
    install is whatever was installed last, not necessarily the code that is running), then the
    installed distribution's metadata, then ``0+unknown``."""
    found = version_from_pyproject(PYPROJECT)
    if found is not None:
        return found
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:  # pragma: no cover - neither a source tree nor installed
        return UNKNOWN


@functools.cache
def version_headers(service: str) -> dict[str, str]:
    """The headers every message a service publishes carries: its release and its name."""
    return {VERSION_HEADER: package_version(), SERVICE_HEADER: service}
