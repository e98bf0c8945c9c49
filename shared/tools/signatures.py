"""A typed tool's contract from its Python signature (pure: pydantic only, no bus).

``async def low_stock(query: StockQuery, ctx: ToolContext) -> StockReport`` or
``async def convert(amount: Annotated[float, Field(gt=0)], currency: Literal["usd", "eur"] = "usd") -> float``:
the parameters (one pydantic model, or annotated parameters) give the input schema, the return
annotation the output schema, the docstring the description. The schemas are plain JSON Schema
2020-12 (pydantic's), registered through the same checks as a hand-written contract.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import to_jsonable_python


class SignatureError(TypeError):
    """A function whose signature cannot be turned into a tool contract; the message says what to change."""


@dataclass(frozen=True)
class Signature:
    """What the executor needs to call a typed tool: its schemas and how to build its arguments."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    arguments: type[BaseModel]  # validates the call's JSON arguments (its validators run too)
    model_param: str | None  # the one parameter that takes the whole arguments model, if the tool has one
    context_param: str | None  # the parameter that receives the ToolContext, if any

    def call_kwargs(self, args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        """The keyword arguments for one call, or ``ValidationError`` when ``args`` do not fit."""
        parsed = self.arguments.model_validate(args)
        kwargs: dict[str, Any] = (
            {self.model_param: parsed}
            if self.model_param
            else {name: getattr(parsed, name) for name in type(parsed).model_fields}
        )
        if self.context_param:
            kwargs[self.context_param] = ctx
        return kwargs


class _Untitled(GenerateJsonSchema):
    """Pydantic's schema without its generated titles ("Sku" for ``sku``): schemas are part of the
    prompt, and a title that repeats the name costs tokens and says nothing."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: Any) -> JsonSchemaValue:
        out = super().model_schema(schema)
        out.pop("title", None)
        return out


def _schema(adapter: TypeAdapter[Any], mode: Literal["validation", "serialization"]) -> dict[str, Any]:
    schema = adapter.json_schema(mode=mode, schema_generator=_Untitled)
    schema.pop("title", None)  # the tool's name says it
    return schema


def _description(fn: Callable[..., Any], given: str | None) -> str:
    text = given or inspect.getdoc(fn) or ""
    if not text.strip():
        raise SignatureError(
            f"@tool {fn.__name__}: give it a description (a docstring, or description=...): the model reads it to "
            "decide when to call the tool"
        )
    return text.strip()


def signature_of(fn: Callable[..., Any], *, name: str | None, description: str | None, context_type: type) -> Signature:
    """The contract of ``fn`` from its annotations, or ``SignatureError`` naming what is missing."""
    tool = name or fn.__name__
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as err:  # a name the annotations use that the module does not define
        raise SignatureError(f"@tool {tool}: its annotations cannot be resolved: {err}") from err
    if "return" not in hints:
        raise SignatureError(
            f"@tool {tool}: annotate the return type (e.g. '-> dict[str, int]' or a pydantic model); "
            "it generates the output contract"
        )
    context_param: str | None = None
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        hint = hints.get(param.name, inspect.Parameter.empty)
        if hint is context_type or (hint is inspect.Parameter.empty and param.name == "ctx"):
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise SignatureError(f"@tool {tool}: parameter '{param.name}' must be a plain named parameter")
        if hint is inspect.Parameter.empty:
            raise SignatureError(
                f"@tool {tool}: annotate parameter '{param.name}' (e.g. 'sku: str'); it generates the input contract"
            )
        fields[param.name] = (hint, ... if param.default is param.empty else param.default)

    model_param: str | None = None
    only = next(iter(fields.values()), None)
    if len(fields) == 1 and only is not None and _is_model(only[0]) and only[1] is ...:
        # one pydantic model parameter: the arguments are that model's fields
        model_param = next(iter(fields))
        arguments: type[BaseModel] = only[0]
    else:
        arguments = create_model(f"{tool}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    input_schema = _schema(TypeAdapter(arguments), "validation")
    if not input_schema.get("properties"):  # a tool without arguments: an empty object, nothing to require
        input_schema = {"type": "object", "additionalProperties": False}
    return Signature(
        name=tool,
        description=_description(fn, description),
        input_schema=input_schema,
        output_schema=_schema(TypeAdapter(hints["return"]), "serialization"),
        arguments=arguments,
        model_param=model_param,
        context_param=context_param,
    )


def _is_model(hint: Any) -> bool:
    return inspect.isclass(hint) and issubclass(hint, BaseModel)


def to_json_value(value: Any) -> Any:
    """A tool's return value as JSON data (pydantic models, dataclasses, dates ...); a str stays a str."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    return to_jsonable_python(value)


__all__ = ["Signature", "SignatureError", "ValidationError", "signature_of", "to_json_value"]
