"""Model providers behind one interface (``base.ModelProvider``), chosen through the registry
``select.PROVIDERS``; every provider passes ``tests/unit/test_provider_conformance.py``."""

from typing import Literal

ProviderName = Literal["anthropic", "openai", "scripted"]
"""Every provider the registry has a row for (``select.PROVIDERS``, checked there at import). The one
place the names are written: the settings (``LW_PLANNER_PROVIDER``) and agent definitions use it."""
