"""Moved: the Messages API stand-in is ``loopwarden.fake_model.FakeModel`` (``loopwarden fake-model``).

This name stays so that test modules written before the move still import.
"""

from loopwarden.fake_model import FakeModel as MessagesApiServer

__all__ = ["MessagesApiServer"]
