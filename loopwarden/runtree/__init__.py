"""A run as a tree of timed steps, and each step's whole detail (pure: no bus, no HTTP).

Built from one ``RunRecord`` (``loopwarden export`` / ``records.collect``): iterations hold the model
turn, the tool calls it made (each with its attempts and its validation), the judge and the Decide
row; escalations and the human's resolution sit where they happened. Times come from the event
stream's own timestamps, as offsets from the run's first event, so every step lies on one time axis
(the console draws it as a waterfall; the terminal prints it). A record holding only the events and
the run state (the console's user cannot read every bucket) still gives the whole tree; the details
say what was not stored.

``step_detail`` is what a step shows when it is opened: the model turn's request and response, a
tool call's arguments, attempts, raw output, validation errors and the result the model saw, the
judge's criteria, a human's resolution. ``clip`` cuts text at a word boundary with a visible ellipsis.

The tree is built in ``runtree.tree``; a step is opened in ``runtree.detail``; time is read out in
``runtree.timing`` (durations, countdowns, the waterfall's bars); all are re-exported here.
"""

from __future__ import annotations

from loopwarden.runtree.detail import (
    Section,
    by_reference,
    output_size,
    sent_before,
    size_text,
    step_detail,
    system_prompt,
)
from loopwarden.runtree.timing import BAR_UNITS, bar, countdown, duration
from loopwarden.runtree.tree import ELLIPSIS, RunTree, Step, StepKind, StepStatus, build, clip, stall_line

__all__ = [
    "BAR_UNITS",
    "ELLIPSIS",
    "RunTree",
    "Section",
    "Step",
    "StepKind",
    "StepStatus",
    "bar",
    "build",
    "by_reference",
    "clip",
    "countdown",
    "duration",
    "output_size",
    "sent_before",
    "size_text",
    "stall_line",
    "step_detail",
    "system_prompt",
]
