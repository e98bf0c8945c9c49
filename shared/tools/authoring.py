"""What a tool author writes against: ``@tool``, ``ToolContext``, ``ToolState``, ``ToolFailure``.

This is the ground floor under the executor (as ``temporalio.activity`` is under its worker): a user's
``from loopwarden import tool`` loads this package and the contracts it needs, never a service. ``@tool``
puts its declaration on the function (``fn.__loopwarden_tool__``); the executor reads it from the modules
it is told to load (``declared_in``), so there is no process-wide list to fill or to reset.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar, overload

from pydantic import ValidationError

from shared.describe import describe
from shared.messages import FailureType, RepairRule, RetryPolicy, ToolContract
from shared.subjects import KV_DEMO, kv_key
from shared.tools.signatures import Signature, SignatureError, signature_of, to_json_value

ToolFn = Callable[[dict[str, Any], "ToolContext"], Awaitable[Any]]
PostHook = Callable[[Any], Any]
BucketOpener = Callable[[str], Awaitable[Any]]  # a KV bucket by name (``Bus.kv``)
STATE_BUCKET = KV_DEMO  # where tools' run state is kept
ATTRIBUTE = "__loopwarden_tool__"  # where ``@tool`` leaves its declaration on the function


class ToolFailure(Exception):
    """Raised by a tool to report a typed failure with a message written for the model.

    Three kinds cover what a tool author means (the constructors say it in words; docs/tools.md):

    - ``ToolFailure.retry(msg, after_s)``, kind ``transient``: retried by the executor with backoff
      (the tool's ``retry`` policy), then its fallback, cached result or boundary.
    - ``ToolFailure.fix_arguments(msg)``, kind ``tool_error``: not retried; the model reads the
      message and calls again with corrected arguments (or answers without).
    - ``ToolFailure.ask_human(msg)``, kind ``fatal``: not retried; the run waits for a person.

    Any other exception a tool raises is a bug in it: ``fatal`` too, with the exception in the message.
    ``ToolFailure(kind, message)`` takes any ``FailureType`` (e.g. ``timeout``, ``unknown_outcome``).
    """

    def __init__(
        self, kind: FailureType, message: str, retry_after_s: float | None = None, effect: str | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after_s = retry_after_s
        self.effect = effect  # none | took_effect | may_have: for a failed non-idempotent call (MCP)

    @classmethod
    def retry(cls, message: str, after_s: float | None = None) -> ToolFailure:
        """Try again later (rate limited, overloaded, a connection dropped): the executor retries."""
        return cls("transient", message, retry_after_s=after_s)

    @classmethod
    def fix_arguments(cls, message: str) -> ToolFailure:
        """The call cannot succeed as asked (no such SKU, a date in the past): the model corrects it."""
        return cls("tool_error", message)

    @classmethod
    def ask_human(cls, message: str) -> ToolFailure:
        """Only a person can decide (a refund over the limit, an account locked): the run escalates."""
        return cls("fatal", message)


class ToolState:
    """Per-run state a tool keeps between calls: JSON values by key, for this run only.

    Kept in the executor's ``lw_demo`` bucket (keys ``state.<run>.<key>``), so a call that lands on
    another executor replica reads what the previous call wrote; the bucket is opened when a tool first
    reads or writes its state, not for every call. Without a bucket opener (a tool called directly, in a
    unit test) it is a dictionary in this process.
    """

    _LOCAL: dict[str, bytes] = {}  # noqa: RUF012 - the in-process stand-in, shared on purpose

    def __init__(self, buckets: BucketOpener | None, run_id: str) -> None:
        self._buckets, self._run_id = buckets, run_id

    async def _store(self) -> Any:
        return None if self._buckets is None else await self._buckets(STATE_BUCKET)

    def _key(self, key: str) -> str:
        return kv_key("state", self._run_id, key)

    async def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key`` in this run, or ``default``."""
        raw = await self._read(await self._store(), key)
        return default if raw is None else json.loads(raw[0])

    async def set(self, key: str, value: Any) -> None:
        """Store ``value`` (anything JSON can hold) under ``key`` for this run."""
        data = json.dumps(value).encode()
        kv = await self._store()
        if kv is None:
            self._LOCAL[self._key(key)] = data
        else:
            await kv.put(self._key(key), data)

    async def update(self, key: str, change: Callable[[Any], Any], default: Any = None) -> Any:
        """Apply ``change`` to the value (``default`` when unset) and store the result, atomically: a
        concurrent writer makes it read and apply again. Returns the stored value."""
        from nats.js.errors import KeyWrongLastSequenceError

        kv = await self._store()
        for _ in range(50):
            raw = await self._read(kv, key)
            value = change(default if raw is None else json.loads(raw[0]))
            data = json.dumps(value).encode()
            if kv is None:
                self._LOCAL[self._key(key)] = data
                return value
            try:
                if raw is None:
                    await kv.create(self._key(key), data)
                else:
                    await kv.update(self._key(key), data, last=raw[1])
                return value
            except KeyWrongLastSequenceError:
                continue
        raise ToolFailure.retry(f"run state '{key}' kept changing under this call")

    async def _read(self, kv: Any, key: str) -> tuple[bytes, int] | None:
        if kv is None:
            local = self._LOCAL.get(self._key(key))
            return None if local is None else (local, 0)
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await kv.get(self._key(key))
        except KeyNotFoundError:
            return None
        return (entry.value, entry.revision) if entry.value else None


@dataclass
class ToolContext:
    """What a tool gets besides its arguments: which run and call this is, the run's state, and the buckets
    a tool may open by name (the demo tools' side-effect ledger): nothing is opened for a tool that asks for none."""

    run_id: str
    call_id: str
    attempt: int  # 1 on the first try, then 2, 3 ... when the executor retries
    buckets: BucketOpener | None = None  # the executor's bucket opener; None when a tool is called directly

    async def bucket(self, name: str) -> Any:
        """The KV bucket ``name`` (created if missing), or None when the tool runs outside the executor."""
        return None if self.buckets is None else await self.buckets(name)

    @property
    def state(self) -> ToolState:
        """This run's state (``await ctx.state.get(key)``, ``set``, ``update``), kept across replicas."""
        return ToolState(self.buckets, self.run_id)


@dataclass(frozen=True)
class Declared:
    """A tool declared with ``@tool``: its contract and the function that runs it."""

    contract: ToolContract
    fn: ToolFn
    post_hook: PostHook | None = None
    text_result: bool = False


def declaration_of(obj: object) -> Declared | None:
    """The declaration ``@tool`` left on ``obj``, or None for anything else."""
    found = getattr(obj, ATTRIBUTE, None) if callable(obj) else None
    return found if isinstance(found, Declared) else None


def declared_in(modules: Iterable[ModuleType]) -> list[Declared]:
    """The tools declared in these modules, in the order they are defined; a function a module imports
    from another is found once."""
    found: dict[int, Declared] = {}
    for module in modules:
        for value in list(vars(module).values()):
            declared = declaration_of(value)
            if declared is not None:
                found.setdefault(id(declared), declared)
    return list(found.values())


_F = TypeVar("_F", bound=Callable[..., Any])


@overload
def tool(fn: _F, /) -> _F: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    input_schema: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    idempotent: bool = False,
    timeout_s: float = 10.0,
    retry: RetryPolicy | None = None,
    fallback: str | None = None,
    boundary: str | None = None,
    group: str | None = None,
    terminal: bool = False,
    repairs: list[RepairRule] | None = None,
    post_hook: PostHook | None = None,
) -> Callable[[_F], _F]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    input_schema: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    idempotent: bool = False,
    timeout_s: float = 10.0,
    retry: RetryPolicy | None = None,
    fallback: str | None = None,
    boundary: str | None = None,
    group: str | None = None,
    terminal: bool = False,
    repairs: list[RepairRule] | None = None,
    post_hook: PostHook | None = None,
) -> Any:
    """Declare a tool next to the function that implements it (docs/tools.md).

    Typed (``@tool`` or ``@tool(idempotent=True, ...)``): the parameters (one pydantic model, or
    annotated parameters) generate the input contract, the return annotation the output contract, the
    docstring the description; a ``ctx: ToolContext`` parameter gets the context; a ``str`` result is
    text. With ``input_schema`` and ``output_schema`` given, the function is ``async def f(args, ctx)``
    over the JSON arguments, as the JSON contract files' entrypoints are (a ``str`` result is JSON text).
    """
    explicit = input_schema is not None or output_schema is not None

    def options() -> dict[str, Any]:
        return {
            "idempotent": idempotent,
            "timeout_s": timeout_s,
            "retry": retry or RetryPolicy(),
            "fallback": fallback,
            "boundary": boundary,
            "group": group,
            "terminal": terminal,
            "repairs": repairs or [],
            "source": "python",
        }

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if explicit:
            if input_schema is None or output_schema is None or not name or not description:
                raise SignatureError(
                    f"@tool {name or fn.__name__}: with schemas given, give name, description, input_schema and "
                    "output_schema (or give none of the schemas and let the annotations generate them)"
                )
            contract = ToolContract.model_validate(
                {
                    "name": name,
                    "description": description,
                    "inputSchema": input_schema,
                    "outputSchema": output_schema,
                    **options(),
                }
            )
            setattr(fn, ATTRIBUTE, Declared(contract, fn, post_hook))
            return fn
        sig = signature_of(fn, name=name, description=description, context_type=ToolContext)
        contract = ToolContract.model_validate(
            {
                "name": sig.name,
                "description": sig.description,
                "inputSchema": sig.input_schema,
                "outputSchema": sig.output_schema,
                **options(),
            }
        )
        setattr(fn, ATTRIBUTE, Declared(contract, typed_runner(sig, fn), post_hook, text_result=True))
        return fn  # the function stays callable as written (a user's unit tests call it directly)

    return wrap if fn is None else wrap(fn)


def typed_runner(sig: Signature, fn: Callable[..., Any]) -> ToolFn:
    """The executor's ``(args, ctx)`` call of a typed tool: arguments validated into its types, the
    result turned into JSON data (a ``str`` stays text)."""
    is_async = inspect.iscoroutinefunction(fn)

    async def run(args: dict[str, Any], ctx: ToolContext) -> Any:
        try:
            kwargs = sig.call_kwargs(args, ctx)
        except ValidationError as err:  # e.g. a model validator beyond what the schema says
            problem = f"the arguments for '{sig.name}' are not accepted: {describe(err)}"
            raise ToolFailure.fix_arguments(problem) from err
        result = await fn(**kwargs) if is_async else await asyncio.to_thread(fn, **kwargs)
        return to_json_value(result)

    run.__name__ = f"run_{sig.name}"
    return run
