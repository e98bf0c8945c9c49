"""The cyclic garbage collector's thresholds in a process of ours: a service, the console, a CLI command.

A process sets them as it starts, before it imports the rest of the tree: ``services/__init__.py`` (every
``python -m services.<name>`` imports that package first), ``loopwarden/console/__init__.py`` and the CLI's
``main``, the test suite's workers (``tests/conftest.py``). Start-up builds some 180 pydantic models' validators, a
few hundred dataclasses and faststream's broker; with CPython's default young generation (700 allocations) the
collector walked that growing heap again and again: 0.01-0.03 s of the ~0.5 s of CPU ``import
services.planner.__main__`` takes on an idle machine, ~0.1 s at load 4 (traversals slow down most under load), and
half of a test worker's collection, which builds the asserts' rewritten ASTs (8.2 -> 4.5 s). Once running, a
service keeps many runs' states, messages and memos alive, and with the defaults the collector walked them all over
and over (measured in the planner on a loaded box: ~1.8 s in full collections of ~4.5 s of CPU for a 64-run
benchmark): a young generation of 10k allocations lets a message's short-lived objects die by refcount first.

A process that is about to end (a CLI command that has answered) freezes what it holds (:func:`ending`): the
interpreter's last collections at exit would walk every object the imports built, for memory the OS takes back.
"""

from __future__ import annotations

import gc

THRESHOLDS = (10_000, 20, 10)


def set_thresholds() -> None:
    gc.set_threshold(*THRESHOLDS)


def ending() -> None:
    """The process ends now: its last collections skip what it holds (``gc.freeze``).

    At exit CPython clears the modules and collects over every tracked object (the wire models' validators,
    faststream's broker, the channel table ...): ~0.08 s of the ~0.6 s of CPU a CLI command that reads a run took on
    this 2-core machine, for memory the OS takes back anyway. Everything else at exit is unchanged (atexit handlers,
    flushing, objects freed by their reference counts). Never in a process that goes on: frozen objects are never
    collected again."""
    gc.freeze()
