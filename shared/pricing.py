"""USD per million tokens, for cost ceilings, as the bill reads: uncached input, cache writes,
cache reads and output each at their own rate. Unknown models are priced like the dearest
known one, so a typo in a model name can only make the ceiling stricter.

Anthropic's prompt cache bills a 5-minute cache write at 1.25x the input rate and a cache
read at 0.1x (``ModelPrice.of``). OpenAI's automatic prompt cache bills no write (a cached
prompt's first pass costs the plain input rate) and reads at the model's own cached-input
rate (``ModelPrice.cached``). A name matches itself or itself plus a ``-suffix`` (a dated
snapshot); the longest matching name wins (``gpt-4o-mini`` is not ``gpt-4o``).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.messages import Usage

CACHE_WRITE_FACTOR = 1.25  # 5-minute ephemeral cache write
CACHE_READ_FACTOR = 0.10


@dataclass(frozen=True)
class ModelPrice:
    input: float
    output: float
    cache_write: float
    cache_read: float

    @classmethod
    def of(cls, inp: float, out: float) -> ModelPrice:
        return cls(inp, out, round(inp * CACHE_WRITE_FACTOR, 6), round(inp * CACHE_READ_FACTOR, 6))

    @classmethod
    def cached(cls, inp: float, cached_input: float, out: float) -> ModelPrice:
        """A model whose provider bills no cache write and reads cached input at ``cached_input``."""
        return cls(inp, out, inp, cached_input)


PRICES: dict[str, ModelPrice] = {
    "claude-opus-4-1": ModelPrice.of(15.0, 75.0),
    "claude-opus-4-6": ModelPrice.of(5.0, 25.0),
    "claude-opus-4-5": ModelPrice.of(5.0, 25.0),
    "claude-sonnet-4-6": ModelPrice.of(3.0, 15.0),
    "claude-sonnet-4-5": ModelPrice.of(3.0, 15.0),
    "claude-sonnet-4": ModelPrice.of(3.0, 15.0),
    "claude-haiku-4-5": ModelPrice.of(1.0, 5.0),
    "claude-3-5-haiku-latest": ModelPrice.of(0.8, 4.0),
    # OpenAI (input, cached input, output)
    "gpt-5": ModelPrice.cached(1.25, 0.125, 10.0),
    "gpt-5-mini": ModelPrice.cached(0.25, 0.025, 2.0),
    "gpt-5-nano": ModelPrice.cached(0.05, 0.005, 0.40),
    "gpt-4.1": ModelPrice.cached(2.0, 0.50, 8.0),
    "gpt-4.1-mini": ModelPrice.cached(0.40, 0.10, 1.60),
    "gpt-4.1-nano": ModelPrice.cached(0.10, 0.025, 0.40),
    "gpt-4o": ModelPrice.cached(2.50, 1.25, 10.0),
    "gpt-4o-mini": ModelPrice.cached(0.15, 0.075, 0.60),
    "o4-mini": ModelPrice.cached(1.10, 0.275, 4.40),
}
PRICES_PER_MTOK: dict[str, tuple[float, float]] = {k: (p.input, p.output) for k, p in PRICES.items()}
_DEAREST = max(PRICES.values(), key=lambda p: (p.input, p.output))


_BY_LENGTH = sorted(PRICES.items(), key=lambda item: -len(item[0]))


def model_price(model: str) -> ModelPrice:
    for name, p in _BY_LENGTH:
        if model == name or model.startswith(name + "-"):
            return p
    return _DEAREST


def price(model: str) -> tuple[float, float]:
    p = model_price(model)
    return p.input, p.output


def cost_usd(model: str, input_tokens: int, output_tokens: int, *, cache_read: int = 0, cache_write: int = 0) -> float:
    """The cost of one call. ``input_tokens`` is every prompt token; ``cache_read`` and
    ``cache_write`` are the parts of it billed at the cache rates (the rest at the input rate)."""
    p = model_price(model)
    uncached = max(0, input_tokens - cache_read - cache_write)
    total = uncached * p.input + cache_write * p.cache_write + cache_read * p.cache_read + output_tokens * p.output
    return round(total / 1_000_000, 8)


def usage_for(model: str, input_tokens: int, output_tokens: int, *, cache_read: int = 0, cache_write: int = 0) -> Usage:
    """Usage of one call; ``input_tokens`` counts every prompt token, cached or not."""
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_input_tokens=cache_read,
        cache_creation_input_tokens=cache_write,
        cost_usd=cost_usd(model, input_tokens, output_tokens, cache_read=cache_read, cache_write=cache_write),
    )
