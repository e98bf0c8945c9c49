"""USD per million tokens, for cost ceilings. Unknown models are priced like the dearest
known one, so a typo in a model name can only make the ceiling stricter."""

from __future__ import annotations

from shared.messages import Usage

PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-3-5-haiku-latest": (0.8, 4.0),
}
_DEAREST = max(PRICES_PER_MTOK.values())


def price(model: str) -> tuple[float, float]:
    for name, p in PRICES_PER_MTOK.items():
        if model == name or model.startswith(name + "-"):
            return p
    return _DEAREST


def cost_usd(model: str, input_tokens: int, output_tokens: int) -> float:
    inp, out = price(model)
    return round((input_tokens * inp + output_tokens * out) / 1_000_000, 8)


def usage_for(model: str, input_tokens: int, output_tokens: int) -> Usage:
    return Usage(
        input_tokens=input_tokens, output_tokens=output_tokens, cost_usd=cost_usd(model, input_tokens, output_tokens)
    )
