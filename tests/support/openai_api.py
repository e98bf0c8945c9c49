"""A local HTTP server that speaks the OpenAI Chat Completions API, for the real ``openai`` SDK to talk to.

As ``messages_api.MessagesApiServer``: tests register a script (a list of replies) under a key and
put ``[script:<key>]`` in the task; each POST /v1/chat/completions whose body mentions that marker
gets the next reply. A reply is one of

* a completion: ``content`` (text or None), ``tool_calls`` (``{"id", "name", "arguments"}``; the
  arguments a dict, or a raw string to send a truncated or malformed one), ``finish_reason``
  (default ``tool_calls`` when there are calls, else ``stop``) and optionally ``usage``
  (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``);
* an HTTP error: ``status``, ``headers`` (e.g. ``retry-after``), ``error``;
* either of them with ``delay_s``: the server answers that much later (for client timeouts).

Usage, unless a reply scripts it, is counted from the request and answered by an automatic prefix
cache the way OpenAI bills it: the longest prefix (tools, then whole messages) an earlier request to
the same model sent is read from the cache when it is at least 1024 tokens, in steps of 128.
Every request body and its headers are recorded for assertions.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

from shared import tokens
from tests.support.http_server import LocalHttpServer, QuietHandler

MARKER = re.compile(r"\[script:([A-Za-z0-9_-]+)\]")
CACHE_MIN_TOKENS = 1024
CACHE_STEP_TOKENS = 128


class ChatCompletionsServer(LocalHttpServer):
    def __init__(self) -> None:
        self.scripts: dict[str, list[dict[str, Any]]] = {}
        self.requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.headers: dict[str, list[dict[str, str]]] = defaultdict(list)
        self._lock = threading.Lock()
        self._prefixes: dict[str, list[list[str]]] = defaultdict(list)  # model -> earlier prompts, as units
        api = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                body = json.loads(raw or b"{}")
                status, headers, payload, delay = api.answer(self.path, body, dict(self.headers))
                if delay:
                    time.sleep(delay)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a timeout test)

        super().__init__(Handler)

    @property
    def base_url(self) -> str:
        """What the SDK's ``base_url`` (or ``OPENAI_BASE_URL``) is set to."""
        return f"{self.url}/v1"

    def script(self, key: str, replies: list[dict[str, Any]]) -> None:
        with self._lock:
            self.scripts[key] = list(replies)

    def answer(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, dict[str, str], Any, float]:
        if not path.endswith("/v1/chat/completions"):
            return 404, {}, _error("not_found", f"no route {path}"), 0.0
        match = MARKER.search(json.dumps(body))
        if not match:
            return 400, {}, _error("invalid_request_error", "no script marker"), 0.0
        key = match.group(1)
        with self._lock:
            self.requests[key].append(body)
            self.headers[key].append(headers)
            queue = self.scripts.get(key, [])
            reply = queue.pop(0) if queue else None
        if reply is None:
            return 500, {}, _error("server_error", f"script {key} exhausted"), 0.0
        delay = float(reply.get("delay_s", 0.0))
        if "status" in reply:
            err = reply.get("error", {"type": "rate_limit_exceeded", "message": "slow down"})
            return int(reply["status"]), dict(reply.get("headers", {})), {"error": err}, delay
        calls = [
            {
                "id": c.get("id") or f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {
                    "name": c["name"],
                    "arguments": c["arguments"] if isinstance(c["arguments"], str) else json.dumps(c["arguments"]),
                },
            }
            for c in reply.get("tool_calls", [])
        ]
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content"), "refusal": None}
        if calls:
            message["tool_calls"] = calls
        finish = reply.get("finish_reason") or ("tool_calls" if calls else "stop")
        usage = self.usage(body, message, reply.get("usage"))
        completion = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": usage,
        }
        return 200, {}, completion, delay

    def usage(self, body: dict[str, Any], message: dict[str, Any], scripted: dict[str, Any] | None) -> dict[str, Any]:
        if scripted is not None:
            prompt, output, cached = (
                scripted["prompt_tokens"],
                scripted["completion_tokens"],
                scripted.get("cached_tokens", 0),
            )
        else:
            prompt, cached = self._prompt(body)
            output = tokens.count(json.dumps(message))
        return {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }

    def _prompt(self, body: dict[str, Any]) -> tuple[int, int]:
        """The prompt's tokens, and how many of them an earlier request's prefix caches."""
        units = [json.dumps(body.get("tools", []), sort_keys=True)]
        units += [json.dumps(m, sort_keys=True) for m in body.get("messages", [])]
        total = sum(tokens.count(u) for u in units)
        with self._lock:
            earlier = self._prefixes[body["model"]]
            common = 0
            for prior in earlier:
                n = 0
                while n < min(len(prior), len(units)) and prior[n] == units[n]:
                    n += 1
                common = max(common, n)
            earlier.append(units)
        shared = sum(tokens.count(u) for u in units[:common])
        cached = shared // CACHE_STEP_TOKENS * CACHE_STEP_TOKENS if shared >= CACHE_MIN_TOKENS else 0
        return total, min(cached, total)


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message, "param": None, "code": None}}
