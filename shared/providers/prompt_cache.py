"""Prompt caching: where the breakpoints go, and how a cache answers a prompt (pure).

Breakpoints (``cache_control: {"type": "ephemeral"}``) mark the end of a cacheable prefix.
The Messages API renders a prompt as tools, then system, then messages; a planner turn puts

* one breakpoint on the system prompt: tools + system, the stable prefix of every turn;
* one *rolling* breakpoint on the last block of the conversation: the next turn's prompt
  starts with this one, so it reads everything up to here from the cache and writes only
  what the turn added.

``PromptCache`` answers a prompt the way the API bills it: the longest prefix ending at a
block boundary that an earlier request cached (looking back up to 20 blocks from each
breakpoint) is read; the prompt up to its last breakpoint is written, minus what was read;
a prefix shorter than the model's minimum is neither. The scripted provider bills with it,
and the local Messages-API server in the tests answers with it, so cache usage is the real
arithmetic everywhere but the real API.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from shared import tokens
from shared.messages import ChatMessage
from shared.providers.anthropic import api_body, to_api_messages
from shared.providers.base import ModelRequest

LOOKBACK_BLOCKS = 20
TTL_S = 300.0


def min_cacheable(model: str) -> int:
    """The shortest prefix the API caches (shorter prompts are billed uncached, without error)."""
    if model.startswith(("claude-haiku-4-5", "claude-opus-4-5")):
        return 4096
    if model.startswith("claude-3-5-haiku"):
        return 2048
    return 1024


@dataclass(frozen=True)
class Block:
    """One block of a rendered prompt: its canonical text, its tokens, and whether it ends a breakpoint."""

    key: str
    tokens: int
    breakpoint: bool = False


@dataclass(frozen=True)
class CacheAnswer:
    read: int
    written: int
    total: int


class PromptCache:
    """An in-memory prompt cache keyed by prefix hash, with the API's TTL (refreshed on a hit)."""

    def __init__(self, ttl_s: float = TTL_S, max_entries: int = 50_000) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._entries: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def answer(self, model: str, blocks: list[Block]) -> CacheAnswer:
        chain = Chain(model)
        chain.extend(blocks)
        return self.answer_chain(
            model, chain.hashes, chain.cumulative, [i for i, b in enumerate(blocks) if b.breakpoint]
        )

    def answer_chain(self, model: str, hashes: list[str], cumulative: list[int], marks: list[int]) -> CacheAnswer:
        """``answer`` for a prompt given by its prefix hashes (``Chain``), running token counts and
        the indices of its breakpoint blocks."""
        now = time.monotonic()
        total = cumulative[-1] if cumulative else 0
        if not marks:
            return CacheAnswer(0, 0, total)
        floor = min_cacheable(model)
        with self._lock:
            read_at = -1
            for mark in marks:
                for i in range(mark, max(-1, mark - LOOKBACK_BLOCKS - 1), -1):
                    seen = self._entries.get(hashes[i])
                    if seen is not None and now - seen <= self.ttl_s:
                        read_at = max(read_at, i)
                        break
            read = cumulative[read_at] if read_at >= 0 else 0
            if read_at >= 0:
                self._entries[hashes[read_at]] = now
                self._entries.move_to_end(hashes[read_at])
            last = marks[-1]
            written = 0
            if last > read_at and cumulative[last] >= floor:
                written = cumulative[last] - read
            for mark in marks:
                if cumulative[mark] >= floor:
                    self._entries[hashes[mark]] = now
                    self._entries.move_to_end(hashes[mark])
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return CacheAnswer(read, written, total)


class Chain:
    """The prefix hashes of a prompt's blocks (each covers the model and every block up to it) and
    the running token count, as ``PromptCache.answer`` keys them; extendable, so a run's next turn
    hashes only the blocks it added."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._h = hashlib.sha256(model.encode())
        self.hashes: list[str] = []
        self.cumulative: list[int] = []

    @property
    def total(self) -> int:
        return self.cumulative[-1] if self.cumulative else 0

    def extend(self, blocks: list[Block]) -> None:
        hashes, cumulative = self.peek(blocks, self._h)
        self.hashes += hashes
        self.cumulative += cumulative

    def peek(self, blocks: list[Block], h: Any = None) -> tuple[list[str], list[int]]:
        """The hashes and running counts ``blocks`` would add, without adding them (``h``: extend in place)."""
        h = self._h.copy() if h is None else h
        hashes: list[str] = []
        cumulative: list[int] = []
        total = self.total
        for b in blocks:
            h.update(b.key.encode())
            hashes.append(h.copy().hexdigest())
            total += b.tokens
            cumulative.append(total)
        return hashes, cumulative


def _canonical(block: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True, ensure_ascii=False)


def blocks_of(body: dict[str, Any]) -> list[Block]:
    """A Messages API request body as the API caches it: tools, then system, then each message's blocks."""
    out: list[Block] = []

    def add(block: dict[str, Any], prefix: str = "") -> None:
        key = prefix + _canonical(block)
        out.append(Block(key=key, tokens=tokens.count(key), breakpoint="cache_control" in block))

    for tool in body.get("tools") or []:
        add(tool, "tool:")
    system = body.get("system")
    if isinstance(system, str):
        if system:
            add({"type": "text", "text": system}, "system:")
    else:
        for block in system or []:
            add(block, "system:")
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            add({"type": "text", "text": content}, f"{message.get('role')}:")
            continue
        for block in content or []:
            add(block, f"{message.get('role')}:")
    return out


# per content block object: (the block, its role, its (key, tokens) as rendered, None when the API drops it)
_RENDERED: dict[int, tuple[weakref.ref[Any], str, tuple[str, int] | None]] = {}


def _message_block(role: str, block: Any) -> tuple[str, int] | None:
    hit = _RENDERED.get(id(block))
    if hit is not None and hit[0]() is block and hit[1] == role:
        return hit[2]
    rendered = to_api_messages([ChatMessage(role=role, content=[block])])
    found = None
    if rendered:
        key = f"{role}:" + _canonical(rendered[0]["content"][0])
        found = (key, tokens.count(key))
    if len(_RENDERED) >= 65_536:  # ids of dead objects may be reused: the identity check above guards that
        _RENDERED.clear()
    _RENDERED[id(block)] = (weakref.ref(block), role, found)
    return found


_TOOLS: dict[int, tuple[weakref.ref[Any], Block]] = {}


def _tool_block(tool: Any) -> Block:
    hit = _TOOLS.get(id(tool))
    if hit is not None and hit[0]() is tool:
        return hit[1]
    key = "tool:" + _canonical(tool.model_dump())
    block = Block(key=key, tokens=tokens.count(key))
    if len(_TOOLS) >= 4096:  # ids of dead objects may be reused: the identity check above guards that
        _TOOLS.clear()
    _TOOLS[id(tool)] = (weakref.ref(tool), block)
    return block


def head_blocks(request: ModelRequest) -> list[Block]:
    """The blocks before the conversation: the tools, then the system prompt (with its breakpoint)."""
    out = [_tool_block(tool) for tool in request.tools]
    out += blocks_of({"system": api_body(request.model_copy(update={"messages": [], "tools": []}))["system"]})
    return out


def message_blocks(message: ChatMessage) -> list[Block]:
    """One message's blocks as the API caches them (each block object rendered and counted once)."""
    out = []
    for block in message.content:
        found = _message_block(message.role, block)
        if found is not None:
            out.append(Block(key=found[0], tokens=found[1]))
    return out


def request_blocks(request: ModelRequest) -> list[Block]:
    """``blocks_of(api_body(request, caching=True))`` for a request sent with breakpoints, each
    message block rendered and counted once per block object: a run's older messages are the same
    objects turn after turn (the planner keeps its state), so a turn's cost does not grow with them."""
    out = head_blocks(request)
    head = len(out)
    for message in request.messages:
        out += message_blocks(message)
    if len(out) > head:  # the rolling breakpoint: the conversation's last block
        out[-1] = Block(key=out[-1].key, tokens=out[-1].tokens, breakpoint=True)
    return out
