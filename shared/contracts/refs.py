"""Where a ``$ref`` inside one schema points, the way the specification resolves it.

A reference is a URI reference resolved against the base URI in scope (the nearest
enclosing ``$id``, itself resolved against its parent's). Its fragment is either a JSON
pointer (``#/$defs/a``), percent-decoded first as any URI fragment is, then ``~1``/``~0``
unescaped, or a plain-name anchor (``$anchor``; a fragment ``$id`` in draft-07). A reference
whose resource is this schema (its own ``$id``) or a resource embedded in it (a nested
``$id``) is local; anything else is remote.

The dialect check uses this to refuse refs that point nowhere, and closing uses it to
know which subschemas a ``$ref`` applies.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from shared.contracts.walk import children, pointer

# The base used when a schema has no absolute $id: any hierarchical URI works, it never leaves this module.
_DEFAULT_BASE = "https://schema.loopwarden.invalid/root"
# RFC 3986: the characters of a URI reference, and of its fragment (no "[", "]" or "#" there).
_URI_REFERENCE = re.compile(r"^[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*\Z")
_FRAGMENT = re.compile(r"^[A-Za-z0-9\-._~:/?@!$&'()*+,;=%]*\Z")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass
class Resources:
    """Every resource (``$id``) and anchor in one schema, by absolute URI, as JSON pointers."""

    root: dict[str, Any]
    by_uri: dict[str, str] = field(default_factory=dict)  # resource URI -> pointer of its schema
    anchors: dict[str, str] = field(default_factory=dict)  # "uri#name" -> pointer
    base_of: dict[str, str] = field(default_factory=dict)  # pointer of each schema -> base URI in scope


def _join(base: str, ref: str) -> str:
    return urljoin(base, ref) if ref else base


def index(root: dict[str, Any]) -> Resources:
    """The resources and anchors of ``root`` (draft-07, 2019-09 and 2020-12 spellings)."""
    res = Resources(root)

    def visit(node: Any, path: str, base: str) -> None:
        if not isinstance(node, dict):
            return
        own_id = node.get("$id")
        if isinstance(own_id, str) and own_id.startswith("#"):  # draft-07 plain-name fragment id
            res.anchors.setdefault(f"{base}{own_id}", path)
        elif isinstance(own_id, str):
            base = urldefrag(_join(base, own_id))[0]
            res.by_uri.setdefault(base, path)
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(key), str):
                res.anchors.setdefault(f"{base}#{node[key]}", path)
        res.base_of[path] = base
        for _, parts, sub in children(node):
            visit(sub, pointer(path, *parts), base)

    res.by_uri[_DEFAULT_BASE] = "#"
    visit(root, "#", _DEFAULT_BASE)
    return res


def decode_pointer(fragment: str) -> list[str] | None:
    """The reference tokens of a JSON-pointer fragment (percent-decoded, then unescaped), or None."""
    decoded = unquote(fragment)
    if decoded == "":
        return []
    if not decoded.startswith("/"):
        return None
    return [t.replace("~1", "/").replace("~0", "~") for t in decoded[1:].split("/")]


def follow(root: Any, start: str, tokens: list[str]) -> str | None:
    """The pointer reached from ``start`` by ``tokens``, or None when it points nowhere."""
    node: Any = at(root, start)
    path = start
    for part in tokens:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
        path = pointer(path, part)
    return path


def at(root: Any, path: str) -> Any:
    """The value at an (escaped) JSON pointer like ``#/properties/a~1b``."""
    node = root
    if path == "#":
        return node
    for raw in path[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


@dataclass(frozen=True)
class Resolution:
    target: str | None  # pointer inside the root schema, when local and found
    remote: bool = False
    problem: str | None = None


def resolve(res: Resources, ref: str, at_path: str) -> Resolution:
    """Resolve ``ref`` written in the schema at ``at_path``."""
    if _BAD_PERCENT.search(ref) or not _URI_REFERENCE.match(ref) or not _FRAGMENT.match(ref.partition("#")[2]):
        return Resolution(
            None,
            problem=f"$ref {ref!r} is not a valid URI reference; percent-encode characters such as '[', ']' or a space",
        )
    base = res.base_of.get(at_path, _DEFAULT_BASE)
    uri, frag = urldefrag(_join(base, ref))
    has_fragment = "#" in ref
    resource = res.by_uri.get(uri)
    if resource is None:
        return Resolution(None, remote=True)
    if not has_fragment or frag == "":
        return Resolution(resource)
    tokens = decode_pointer(frag)
    if tokens is not None:
        target = follow(res.root, resource, tokens)
        return Resolution(target, problem=None if target else f"$ref {ref!r} points nowhere in this schema")
    anchor = res.anchors.get(f"{uri}#{unquote(frag)}")
    return Resolution(anchor, problem=None if anchor else f"$ref {ref!r} names an anchor this schema does not define")


def refs(node: Any, path: str = "#") -> Iterator[tuple[str, str]]:
    """Each ``$ref`` in a schema as (pointer of the schema holding it, the reference)."""
    if not isinstance(node, dict):
        return
    if isinstance(node.get("$ref"), str):
        yield path, node["$ref"]
    for _, parts, sub in children(node):
        yield from refs(sub, pointer(path, *parts))
