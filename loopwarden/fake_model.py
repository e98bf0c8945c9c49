"""``loopwarden fake-model``: a local stand-in for the Anthropic Messages API, to rehearse live runs offline.

Point a stack at it (``ANTHROPIC_BASE_URL=http://127.0.0.1:PORT``, any ``ANTHROPIC_API_KEY``) and
a live run (``submit --task``) goes through the real SDK, the real planner, executor and judge,
with no key and no network. What it answers:

- **By default**, a plausible, deterministic agent: it calls each tool it is offered once (in the
  order offered, terminal ``submit_result`` last) with arguments made from the tool's input schema,
  then answers with a text that lists what it called. A judge request (the judge's system prompt)
  gets a score of 1.0 for every criterion of the rubric.
- **With a script** (``--script FILE``, JSON or YAML): a list of replies given in order, one per
  request (then the default again). A reply is a message, ``{"content": [blocks], "stop_reason": ...}``,
  or an HTTP error, ``{"status": 429, "headers": {...}, "error": {...}}``; either may carry ``delay_s``
  (answered that much later). A mapping of
  ``key: [replies]`` scripts only the requests that mention ``[script:<key>]`` (in the task, say),
  which is how the test suite drives it (``FakeModel.script``).

Usage (tokens) is counted from the request, with prompt caching answered as the API bills it.
Every request body is recorded per script key (``requests``) for tests to assert on.

**With a rate limit** (``RateLimit``, ``--requests-per-s``/``--input-tokens-per-s``) it enforces it the way
Anthropic describes its own: a token bucket per limit (one second's worth of capacity, refilled continuously),
a request costing one request and its input tokens (the prompt cache's reads not counted); a request beyond
either is answered 429 with ``retry-after`` (seconds until it would fit). Every answer announces the limits
in Anthropic's headers (per minute, as the API states them), what is left and when the bucket is full again
(``anthropic-ratelimit-requests-*``, ``anthropic-ratelimit-input-tokens-*``). ``answered`` and ``rejected``
count its answers and ``arrivals`` records each request's time and status; ``GET /stats`` answers them as
JSON (with the input tokens the limit charged), for a benchmark that runs it as a process of its own.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

MARKER = re.compile(r"\[script:([A-Za-z0-9_-]+)\]")
DEFAULT_KEY = "_default"  # requests without a marker: recorded under this key
JUDGE_MARKER = "Score the candidate answer against each criterion"  # services/judge/scoring.JUDGE_SYSTEM
_CRITERION = re.compile(r"^- (.+?)(?:: .*?)?(?: \(required\))?$")
TERMINAL = "submit_result"


@dataclass
class Bucket:
    """One limit as a token bucket: ``rate`` a second, ``capacity`` at most (what a burst may take)."""

    rate: float
    capacity: float
    level: float = -1.0  # -1: full, at first use
    at: float = 0.0

    def refill(self, now: float) -> None:
        self.level = self.capacity if self.level < 0 else min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now

    def short_by(self, cost: float) -> float:
        """Seconds until ``cost`` fits (a cost above the capacity fits a full bucket)."""
        return max(0.0, min(cost, self.capacity) - self.level) / self.rate


@dataclass
class RateLimit:
    """What the stand-in enforces: requests and input tokens a second, each a bucket of ``burst_s`` seconds."""

    requests_per_s: float = 10.0
    input_tokens_per_s: float = 20_000.0
    burst_s: float = 1.0
    buckets: dict[str, Bucket] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.buckets = {
            "requests": Bucket(self.requests_per_s, self.requests_per_s * self.burst_s),
            "input-tokens": Bucket(self.input_tokens_per_s, self.input_tokens_per_s * self.burst_s),
        }

    def take(self, now: float, input_tokens: float) -> float:
        """Charge one request of ``input_tokens`` now: 0.0 if it fits (taken), else seconds until it would."""
        costs = {"requests": 1.0, "input-tokens": input_tokens}
        for bucket in self.buckets.values():
            bucket.refill(now)
        wait = max(self.buckets[name].short_by(cost) for name, cost in costs.items())
        if wait > 0:
            return wait
        for name, cost in costs.items():
            self.buckets[name].level -= cost
        return 0.0

    def headers(self, now: float, wall: float) -> dict[str, str]:
        """The limits as Anthropic announces them: per minute, what is left now, when the bucket is full."""
        out: dict[str, str] = {}
        for name, bucket in self.buckets.items():
            bucket.refill(now)
            full_in = (bucket.capacity - bucket.level) / bucket.rate
            reset = datetime.fromtimestamp(wall + full_in, UTC).isoformat(timespec="milliseconds")
            out[f"anthropic-ratelimit-{name}-limit"] = str(round(bucket.rate * 60))
            out[f"anthropic-ratelimit-{name}-remaining"] = str(max(0, math.floor(bucket.level)))
            out[f"anthropic-ratelimit-{name}-reset"] = reset.replace("+00:00", "Z")
        return out


class FakeModel:
    """The Messages API server: ``start()`` serves it from a thread on ``host:port`` (0: a free port)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        script: list[dict[str, Any]] | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        self.scripts: dict[str, list[dict[str, Any]]] = {}
        self.default_script: list[dict[str, Any]] = list(script or [])
        self.requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.headers: dict[str, list[dict[str, str]]] = defaultdict(list)
        self.rate_limit = rate_limit
        self.answered = 0  # 200s
        self.rejected = 0  # 429s the rate limit answered (a scripted 429 is counted as scripted: ``arrivals``)
        self.arrivals: list[tuple[float, int]] = []  # (epoch seconds, status) of every /v1/messages request
        self.charged_tokens = 0  # input tokens the rate limit charged the answered requests
        self._lock = threading.Lock()
        # imported here: the SDK's types are heavy, and every `loopwarden` command imports this module
        from shared.providers.prompt_cache import PromptCache

        self.cache = PromptCache()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                """``/stats``: what it answered (for a benchmark that runs it as its own process)."""
                if self.path.rstrip("/") != "/stats":
                    self.send_error(404)
                    return
                data = json.dumps(api.stats()).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = None
                headers: dict[str, str] = {}
                if not isinstance(body, dict):
                    status, payload = 400, _error("invalid_request_error", "the body is not a JSON object")
                else:
                    status, headers, payload = api.answer(self.path, body, dict(self.headers))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def stats(self) -> dict[str, Any]:
        """What it answered: 200s, the rate limit's 429s, each request's (time, status), the tokens charged."""
        with self._lock:
            return {
                "answered": self.answered,
                "rejected": self.rejected,
                "charged_input_tokens": self.charged_tokens,
                "arrivals": list(self.arrivals),
            }

    def script(self, key: str, replies: list[dict[str, Any]]) -> None:
        """Replies for the requests that mention ``[script:<key>]``, one each, in order."""
        with self._lock:
            self.scripts[key] = list(replies)

    def answer(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        if not path.endswith("/v1/messages"):
            return 404, {}, _error("not_found_error", path)
        arrived = time.time()
        match = MARKER.search(json.dumps(body))
        key = match.group(1) if match else DEFAULT_KEY
        cached = None
        charged = 0
        limits: dict[str, str] = {}
        if self.rate_limit is not None:  # charged before anything is answered, as the API does
            cached = self.cache.answer(body.get("model", "fake-model"), _blocks(body))
            charged = max(cached.total, _count(json.dumps(body))) - cached.read  # cache reads do not count
            with self._lock:
                now, wall = time.monotonic(), time.time()
                wait = self.rate_limit.take(now, charged)
                limits = self.rate_limit.headers(now, wall)
                if wait > 0:
                    self.rejected += 1
                    self.arrivals.append((arrived, 429))
                    self.requests[key].append(body)
                    self.headers[key].append(headers)
                    retry = {"retry-after": f"{wait:.3f}", **limits}
                    return 429, retry, _error("rate_limit_error", "rate limited by the fake model's limit")
        with self._lock:
            self.requests[key].append(body)
            self.headers[key].append(headers)
            if match:
                queue = self.scripts.get(key, [])
                reply = queue.pop(0) if queue else None
                if reply is None:
                    self.arrivals.append((arrived, 500))
                    return 500, limits, _error("api_error", f"script {key} exhausted")
            else:
                reply = self.default_script.pop(0) if self.default_script else default_reply(body)
            status = int(reply.get("status", 200))
            self.arrivals.append((arrived, status))
            self.answered += status == 200
            self.charged_tokens += charged if status == 200 else 0
        if reply.get("delay_s"):  # a slow reply, for client timeouts (the server is threaded)
            time.sleep(float(reply["delay_s"]))
        if "status" in reply:
            err = reply.get("error", {"type": "rate_limit_error", "message": "slow down"})
            return int(reply["status"]), {**limits, **reply.get("headers", {})}, {"type": "error", "error": err}
        content = reply["content"]
        stop = reply.get("stop_reason") or ("tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn")
        usage = reply.get("usage") or self.usage(body, content, float(reply.get("input_scale", 1.0)), cached)
        return (
            200,
            limits,
            {
                "id": f"msg_{uuid.uuid4().hex[:24]}",
                "type": "message",
                "role": "assistant",
                "model": body.get("model", "fake-model"),
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": usage,
            },
        )

    def usage(
        self, body: dict[str, Any], content: list[dict[str, Any]], scale: float = 1.0, cached: Any = None
    ) -> dict[str, Any]:
        """Usage counted from the request; ``scale`` stands for a provider whose tokenizer counts more;
        ``cached``: the prompt cache's answer for this request, if the rate limit asked it already."""
        answer = cached if cached is not None else self.cache.answer(body.get("model", "fake-model"), _blocks(body))
        total = round(max(answer.total, _count(json.dumps(body))) * scale)
        return {
            "input_tokens": total - answer.read - answer.written,  # the API's input_tokens excludes the cache
            "cache_read_input_tokens": answer.read,
            "cache_creation_input_tokens": answer.written,
            "output_tokens": _count(json.dumps(content)),
        }


def _blocks(body: dict[str, Any]) -> Any:
    from shared.providers.prompt_cache import blocks_of

    return blocks_of(body)


def _count(text: str) -> int:
    from shared import tokens

    return tokens.count(text)


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


# --- the default agent -------------------------------------------------------------------------------


def default_reply(body: dict[str, Any]) -> dict[str, Any]:
    """The next turn of a plausible agent: each offered tool once, then a text answer (or a judge's scores)."""
    system = _text_of(body.get("system"))
    if JUDGE_MARKER in system:
        return {"content": [{"type": "text", "text": json.dumps(judge_scores(_last_user_text(body)))}]}
    called = [
        b.get("name")
        for m in body.get("messages", [])
        if m.get("role") == "assistant" and isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    offered = [t for t in body.get("tools", []) if isinstance(t, dict) and "input_schema" in t]
    pending = [t for t in offered if t["name"] not in called and t["name"] != TERMINAL]
    summary = "Done. Called: " + (", ".join(str(n) for n in called) if called else "no tools") + "."
    if pending:
        tool = pending[0]
        args = example_of(tool["input_schema"], tool["input_schema"])
        return {"content": [_tool_use(tool["name"], args if isinstance(args, dict) else {})]}
    terminal = next((t for t in offered if t["name"] == TERMINAL), None)
    if terminal is not None and TERMINAL not in called:
        args = example_of(terminal["input_schema"], terminal["input_schema"])
        if isinstance(args, dict) and "answer" in terminal["input_schema"].get("properties", {}):
            args["answer"] = summary
        return {"content": [_tool_use(TERMINAL, args if isinstance(args, dict) else {})]}
    return {"content": [{"type": "text", "text": summary}]}


def _tool_use(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": name, "input": args}


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(b.get("text", "") for b in value if isinstance(b, dict))
    return ""


def _last_user_text(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return _text_of(users[-1].get("content")) if users else ""


def judge_scores(prompt: str) -> dict[str, Any]:
    """Full marks for every criterion the judge's prompt lists (after its ``Criteria:`` line)."""
    names: list[str] = []
    if "Criteria:" in prompt:
        for line in prompt.rsplit("Criteria:", 1)[1].splitlines():
            found = _CRITERION.match(line.strip())
            if found:
                names.append(found.group(1))
    return {"scores": dict.fromkeys(names, 1.0), "reasons": dict.fromkeys(names, "met (fake model)")}


def example_of(schema: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """A value that fits ``schema`` for the common cases (types, enums, bounds, required fields, local $refs)."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if "$ref" in schema and isinstance(schema["$ref"], str) and schema["$ref"].startswith("#/"):
        target: Any = root
        for part in schema["$ref"][2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return example_of(target, root, depth + 1)
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    if schema.get("examples"):
        return schema["examples"][0]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return example_of(schema[key][0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = schema.get("required") or list(props)
        return {name: example_of(props.get(name, {}), root, depth + 1) for name in required}
    if kind == "array":
        return [example_of(schema.get("items", {}), root, depth + 1) for _ in range(max(1, schema.get("minItems", 1)))]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0) + (1 if "exclusiveMinimum" in schema else 0))
        high = schema.get("maximum")
        value = max(low, 1) if high is None else min(max(low, 1), high)
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = {"date": "2026-01-01", "date-time": "2026-01-01T00:00:00Z", "email": "user@example.com"}.get(
        schema.get("format", ""), "example"
    )
    return (text * max(1, -(-schema.get("minLength", 0) // len(text))))[: schema.get("maxLength", 10_000)]


# --- the command ----------------------------------------------------------------------------------------


def load_script(path: str) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """A script file: a list of replies (for every request), or ``key: [replies]`` (marked requests)."""
    import yaml

    text = Path(path).read_text()
    data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    if isinstance(data, list) and all(isinstance(r, dict) and ("content" in r or "status" in r) for r in data):
        return data, {}
    if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
        return [], {str(k): v for k, v in data.items()}
    raise ValueError(
        f"{path}: expected a list of replies ({{content: [...]}} or {{status: ...}}) or a mapping key -> replies"
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fake-model",
        help="serve a local stand-in for the Anthropic Messages API (live runs offline, no key)",
        description="Serve a stand-in for the Anthropic Messages API on 127.0.0.1, for live runs with no key and "
        "no network: start the stack with ANTHROPIC_BASE_URL set to the URL it prints (and any "
        "ANTHROPIC_API_KEY). Without --script it calls each offered tool once with arguments made from its "
        "schema, then answers with a text (and scores every rubric criterion 1.0 when asked to judge).",
    )
    p.add_argument("--port", type=int, default=8765, help="port to listen on (0: a free one; default 8765)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--script", metavar="FILE", help="scripted replies (JSON or YAML; see docs/tools.md)")
    p.add_argument(
        "--requests-per-s",
        type=float,
        metavar="N",
        help="enforce a rate limit: N requests a second (429 with retry-after beyond; docs/rate-limits.md)",
    )
    p.add_argument(
        "--input-tokens-per-s",
        type=float,
        metavar="N",
        help="enforce a rate limit: N input tokens a second (with --requests-per-s; default 20000)",
    )
    p.set_defaults(func=cmd_fake_model)


def cmd_fake_model(args: argparse.Namespace) -> int:
    from loopwarden.cli_common import OK, UserError, say

    default: list[dict[str, Any]] = []
    keyed: dict[str, list[dict[str, Any]]] = {}
    if args.script:
        try:
            default, keyed = load_script(args.script)
        except (OSError, ValueError) as err:
            raise UserError(f"--script: {err}") from err
    limit = None
    if args.requests_per_s is not None or args.input_tokens_per_s is not None:
        requests, tokens = args.requests_per_s or 10.0, args.input_tokens_per_s or 20_000.0
        if requests <= 0 or tokens <= 0:
            raise UserError("--requests-per-s and --input-tokens-per-s must be above 0")
        limit = RateLimit(requests_per_s=requests, input_tokens_per_s=tokens)
    try:
        model = FakeModel(args.host, args.port, default, rate_limit=limit)
    except OSError as err:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}; try --port 0") from err
    for key, replies in keyed.items():
        model.script(key, replies)
    say(f"fake Messages API on {model.base_url}")
    if limit is not None:
        say(f"  rate limit: {limit.requests_per_s:g} requests/s, {limit.input_tokens_per_s:g} input tokens/s")
    say(f"  export ANTHROPIC_BASE_URL={model.base_url} ANTHROPIC_API_KEY=fake  (then `loopwarden up`)")
    say("  Ctrl-C stops it")
    sys.stdout.flush()
    try:
        model.server.serve_forever()
    except KeyboardInterrupt:
        say("stopped the fake model")
    finally:
        model.server.server_close()
    return OK
