"""Where the shipped data is: ``schemas/`` and ``scenarios/`` beside the package in a wheel, at the
repository root in a checkout."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    for candidate in (_HERE / name, _HERE.parent / name):  # installed wheel, then the repository
        if candidate.is_dir():
            return candidate
    return _HERE.parent / name


def scenarios_dir() -> Path:
    return _find("scenarios")


def schemas_dir() -> Path:
    return _find("schemas")
