"""A local HTTP server that speaks the Anthropic Messages API, for the real SDK to talk to.

Tests register a script (a list of replies) under a key and put ``[script:<key>]`` in the
task; each POST /v1/messages whose system prompt or messages mention that marker gets the
next reply. A reply is either a message (``content`` blocks, ``stop_reason``) or an HTTP
error (``status``, ``headers``, ``error``). Every request body is recorded for assertions.
A reply may carry ``delay_s`` (answered that much later). A message reply may carry
``input_scale``: the counted prompt tokens times that (a tokenizer that counts more than ours),
for calibration tests.

Usage, unless a reply scripts it, is counted from the request and answered by a prompt cache
the way the real API bills it: ``cache_control`` breakpoints, a read of the longest prefix an
earlier request cached, a write up to the last breakpoint, ``input_tokens`` the rest.
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
from shared.providers.prompt_cache import PromptCache, blocks_of
from tests.support.http_server import LocalHttpServer, QuietHandler

MARKER = re.compile(r"\[script:([A-Za-z0-9_-]+)\]")


class MessagesApiServer(LocalHttpServer):
    def __init__(self) -> None:
        self.scripts: dict[str, list[dict[str, Any]]] = {}
        self.requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.headers: dict[str, list[dict[str, str]]] = defaultdict(list)
        self._lock = threading.Lock()
        self.cache = PromptCache()
        api = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                body = json.loads(raw or b"{}")
                status, headers, payload = api.answer(self.path, body, dict(self.headers))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        super().__init__(Handler)

    @property
    def base_url(self) -> str:
        return self.url

    def script(self, key: str, replies: list[dict[str, Any]]) -> None:
        with self._lock:
            self.scripts[key] = list(replies)

    def answer(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        if not path.endswith("/v1/messages"):
            return 404, {}, {"type": "error", "error": {"type": "not_found_error", "message": path}}
        match = MARKER.search(json.dumps(body))
        if not match:
            return 400, {}, {"type": "error", "error": {"type": "invalid_request_error", "message": "no script marker"}}
        key = match.group(1)
        with self._lock:
            self.requests[key].append(body)
            self.headers[key].append(headers)
            queue = self.scripts.get(key, [])
            reply = queue.pop(0) if queue else None
        if reply is None:
            return 500, {}, {"type": "error", "error": {"type": "api_error", "message": f"script {key} exhausted"}}
        if reply.get("delay_s"):  # a slow reply, for client timeouts (the server is threaded)
            time.sleep(float(reply["delay_s"]))
        if "status" in reply:
            err = reply.get("error", {"type": "rate_limit_error", "message": "slow down"})
            return int(reply["status"]), dict(reply.get("headers", {})), {"type": "error", "error": err}
        content = reply["content"]
        stop = reply.get("stop_reason") or ("tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn")
        usage = reply.get("usage") or self.usage(body, content, float(reply.get("input_scale", 1.0)))
        return (
            200,
            {},
            {
                "id": f"msg_{uuid.uuid4().hex[:24]}",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": usage,
            },
        )

    def usage(self, body: dict[str, Any], content: list[dict[str, Any]], scale: float = 1.0) -> dict[str, Any]:
        """Usage counted from the request; ``scale`` stands for a provider whose tokenizer counts more."""
        answer = self.cache.answer(body["model"], blocks_of(body))
        total = round(max(answer.total, tokens.count(json.dumps(body))) * scale)
        return {
            "input_tokens": total - answer.read - answer.written,  # the API's input_tokens excludes the cache
            "cache_read_input_tokens": answer.read,
            "cache_creation_input_tokens": answer.written,
            "output_tokens": tokens.count(json.dumps(content)),
        }
