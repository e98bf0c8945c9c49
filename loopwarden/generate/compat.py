"""Is a contract change safe for the last release's services? (``docs/upgrades.md``)

Services are upgraded one at a time while runs are in flight, so for a while every message can be
written by one release and read by the other, in both directions:

* **old writer -> new reader** (Confluent's BACKWARD): everything the last release may send must
  still be accepted. Breaks: a new required field, a field made required, a narrowed type (a type
  dropped, enum values removed, a tighter pattern, a lower maxLength/maximum, a higher minimum, a
  union member removed, a new format).
* **new writer -> old reader** (FORWARD): an older reader must still find what it reads. Breaks:
  a removed (or renamed) field, a required field made optional, a field added to an object the old
  reader closes (``additionalProperties: false``).

A *widened* type (a new enum value, a new union member, a looser bound) is allowed: readers that
know it must be upgraded before writers send it (the upgrade order of ``docs/upgrades.md``), which
is what the finding says. A new optional field is allowed both ways (older readers ignore unknown
fields). Subjects (AsyncAPI channels, the catalogue) may be added; one may be removed only once
the last release served its successor (``lw.v1.x`` retired after a release served ``lw.v2.x``). A
breaking change to a message contract is allowed only as a new subject version: the contract's
old subjects still carry its old shape (under another name) and the new shape travels on
``lw.v<n+1>`` - buf's "a breaking change is a new package version".

Pure: JSON in, findings out. ``python -m loopwarden.generate snapshot`` stores the current contracts as
the release's (``make release-snapshot``); ``python -m loopwarden.generate check`` compares them with the
last release's; ``tests/repo/test_compat_release.py`` fails on a breaking finding.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from loopwarden.generate import ROOT, SCHEMAS

Kind = Literal[
    # breaking
    "removed_field",
    "new_required_field",
    "now_required",
    "now_optional",
    "narrowed",
    "type_changed",
    "field_refused",
    "removed_contract",
    "removed_subject",
    "payload_changed",
    # allowed
    "new_optional_field",
    "widened",
    "new_contract",
    "new_subject",
    "retired_subject",
    "versioned",
]
BREAKING: frozenset[Kind] = frozenset(get_args(Kind)[:10])
RELEASES = SCHEMAS / "releases"
CATALOGUE = "catalogue.json"
OLD_WRITER = "old writer -> new reader"
NEW_WRITER = "new writer -> old reader"

Json = dict[str, Any]


@dataclass(frozen=True)
class Finding:
    """One difference between a release's contract and the current one."""

    contract: str  # a message contract (``ToolCall``), ``catalogue`` or ``channel <address> (<action>)``
    field: str  # dotted path inside the contract ("" for the contract itself)
    kind: Kind
    why: str

    @property
    def breaking(self) -> bool:
        return self.kind in BREAKING

    def __str__(self) -> str:
        where = f"{self.contract}.{self.field}" if self.field else self.contract
        return f"{where}: {self.kind.replace('_', ' ')}: {self.why}"


# --- one JSON Schema against another --------------------------------------------------------------------------------

UPPER = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum")
LOWER = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum")
_QUANT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def resolve(root: Json, ref: str) -> Json:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return dict(node)


def _deref(root: Json, schema: Json) -> tuple[Json, str]:
    ref = ""
    for _ in range(32):
        if "$ref" not in schema:
            break
        ref = str(schema["$ref"])
        schema = {**resolve(root, ref), **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema, ref


def _types(schema: Json) -> set[str] | None:
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return set(t)
    if "properties" in schema:
        return {"object"}
    return None


def _accepts(types: set[str], t: str) -> bool:
    return t in types or (t == "integer" and "number" in types)


def _branches(schema: Json) -> list[Json] | None:
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return [dict(b) for b in schema[key]]
    return None


def _signature(root: Json, branch: Json) -> str:
    """What a union member is, to pair it with the other release's: its definition, its constant, its type."""
    if "$ref" in branch:
        return str(branch["$ref"]).rsplit("/", 1)[-1]
    if "const" in branch:
        return f"const {json.dumps(branch['const'])}"
    types = _types(branch)
    return "|".join(sorted(types)) if types else json.dumps(branch, sort_keys=True)


def pattern_relation(old: str, new: str) -> Literal["same", "wider", "narrower", "unknown"]:
    """Two patterns that differ only in their ``{m,n}`` bounds compare by them; any other change is unknown
    (nobody can tell cheaply whether every string the old one matched still matches)."""
    if old == new:
        return "same"
    if _QUANT.sub("{}", old) != _QUANT.sub("{}", new):
        return "unknown"
    wider = narrower = False
    for o, n in zip(_QUANT.finditer(old), _QUANT.finditer(new), strict=True):
        olo, nlo = int(o.group(1)), int(n.group(1))
        ohi = float("inf") if o.group(2) == "" else int(o.group(2) or o.group(1))
        nhi = float("inf") if n.group(2) == "" else int(n.group(2) or n.group(1))
        wider |= nlo < olo or nhi > ohi
        narrower |= nlo > olo or nhi < ohi
    if wider and narrower:
        return "unknown"
    return "wider" if wider else "narrower" if narrower else "same"


@dataclass
class _Walk:
    contract: str
    old_root: Json
    new_root: Json
    out: list[Finding] = field(default_factory=list)
    seen: set[tuple[int, str, str]] = field(default_factory=set)

    def add(self, path: str, kind: Kind, why: str) -> None:
        self.out.append(Finding(self.contract, path, kind, why))

    def compare(self, path: str, old: Json, new: Json) -> None:
        old, oref = _deref(self.old_root, old)
        new, nref = _deref(self.new_root, new)
        if oref or nref:
            key = (path.count("."), oref, nref)  # recursive definitions: once per depth is enough
            if key in self.seen or path.count(".") > 12:
                return
            self.seen.add(key)
        ob, nb = _branches(old), _branches(new)
        if ob is not None or nb is not None:
            self._union(path, ob if ob is not None else [old], nb if nb is not None else [new])
            return
        self._types(path, old, new)
        self._values(path, old, new)
        self._bounds(path, old, new)
        self._object(path, old, new)
        if isinstance(old.get("items"), dict) and isinstance(new.get("items"), dict):
            self.compare(f"{path}[]" if path else "[]", old["items"], new["items"])

    def _union(self, path: str, ob: list[Json], nb: list[Json]) -> None:
        old_sig = {_signature(self.old_root, b): b for b in ob}
        new_sig = {_signature(self.new_root, b): b for b in nb}
        for sig, branch in old_sig.items():
            if sig in new_sig:
                self.compare(path, branch, new_sig[sig])
                continue
            wider = [
                b
                for b in nb
                if "$ref" not in b
                and "$ref" not in branch
                and (t := _types(b))
                and (ot := _types(branch))
                and all(_accepts(t, x) for x in ot)
            ]
            if wider:
                self.compare(path, branch, wider[0])
            else:
                self.add(path, "narrowed", f"no longer accepts {sig}, which an older writer may send ({OLD_WRITER})")
        for sig in new_sig.keys() - old_sig.keys():
            self.add(path, "widened", f"now also {sig}: upgrade its readers before its writers send it ({NEW_WRITER})")

    def _types(self, path: str, old: Json, new: Json) -> None:
        ot, nt = _types(old), _types(new)
        if ot is None or nt is None:
            if ot is not None and nt is None:
                self.add(path, "widened", f"any type now (was {'|'.join(sorted(ot))})")
            elif nt is not None and ot is None and "const" not in old and "enum" not in old:
                self.add(path, "narrowed", f"must be {'|'.join(sorted(nt))} now, any type before ({OLD_WRITER})")
            return
        gone = sorted(t for t in ot if not _accepts(nt, t))
        if gone:
            kept = any(_accepts(nt, t) for t in ot) or ("number" in ot and "integer" in nt)
            kind: Kind = "narrowed" if kept else "type_changed"
            self.add(
                path,
                kind,
                f"type {'|'.join(sorted(ot))} -> {'|'.join(sorted(nt))}: an older writer's {', '.join(gone)} "
                f"is refused ({OLD_WRITER})",
            )
        added = sorted(t for t in nt if not _accepts(ot, t))
        if added and not gone:
            self.add(path, "widened", f"now also {', '.join(added)}: upgrade its readers first ({NEW_WRITER})")

    def _values(self, path: str, old: Json, new: Json) -> None:
        oe = old.get("enum", [old["const"]] if "const" in old else None)
        ne = new.get("enum", [new["const"]] if "const" in new else None)
        if oe is not None and ne is not None:
            gone = [v for v in oe if v not in ne]
            added = [v for v in ne if v not in oe]
            if gone:
                self.add(
                    path,
                    "narrowed",
                    f"values removed {json.dumps(gone)}: an older writer still sends them ({OLD_WRITER})",
                )
            if added:
                self.add(path, "widened", f"new values {json.dumps(added)}: upgrade its readers first ({NEW_WRITER})")
        elif ne is not None:
            self.add(path, "narrowed", f"now only {json.dumps(ne)}, any value before ({OLD_WRITER})")
        elif oe is not None:
            self.add(path, "widened", f"any value now (was {json.dumps(oe)})")
        of, nf = old.get("format"), new.get("format")
        if nf is not None and nf != of:
            self.add(
                path,
                "narrowed",
                f"format {of or 'none'} -> {nf}: an older writer's value may not be one ({OLD_WRITER})",
            )
        elif of is not None and nf is None:
            self.add(path, "widened", f"format {of} dropped")
        op, np_ = old.get("pattern"), new.get("pattern")
        if np_ is not None and op is None:
            self.add(path, "narrowed", f"must match {np_} now ({OLD_WRITER})")
        elif op is not None and np_ is None:
            self.add(path, "widened", f"pattern {op} dropped")
        elif op is not None and np_ is not None:
            rel = pattern_relation(op, np_)
            if rel in ("narrower", "unknown"):
                why = "tighter" if rel == "narrower" else "changed, and not provably looser"
                self.add(path, "narrowed", f"pattern {why}: {op} -> {np_} ({OLD_WRITER})")
            elif rel == "wider":
                self.add(path, "widened", f"pattern looser: {op} -> {np_}: upgrade its readers first ({NEW_WRITER})")

    def _bounds(self, path: str, old: Json, new: Json) -> None:
        for key in UPPER + LOWER:
            o, n = old.get(key), new.get(key)
            if o == n or isinstance(o, bool) or isinstance(n, bool):
                continue
            upper = key in UPPER
            tighter = o is None or (n is not None and (n < o if upper else n > o))
            if n is not None and tighter:
                self.add(path, "narrowed", f"{key} {o if o is not None else 'none'} -> {n} ({OLD_WRITER})")
            else:
                self.add(path, "widened", f"{key} {o} -> {n if n is not None else 'none'}: upgrade its readers first")

    def _object(self, path: str, old: Json, new: Json) -> None:
        op: Json = old.get("properties") or {}
        np_: Json = new.get("properties") or {}
        oreq, nreq = set(old.get("required") or ()), set(new.get("required") or ())
        at = f"{path}." if path else ""
        for name, schema in op.items():
            if name not in np_:
                if name in oreq:
                    why = f"an older reader requires it and refuses every message without it ({NEW_WRITER})"
                else:
                    why = f"an older reader reads it and would silently fall back to its default ({NEW_WRITER})"
                self.add(f"{at}{name}", "removed_field", f"{why}; a rename is a removal plus a new field")
                continue
            self.compare(f"{at}{name}", schema, np_[name])
            if name in nreq and name not in oreq:
                self.add(f"{at}{name}", "now_required", f"an older writer may leave it out ({OLD_WRITER})")
            elif name in oreq and name not in nreq:
                self.add(
                    f"{at}{name}",
                    "now_optional",
                    f"an older reader requires it; a new writer may leave it out ({NEW_WRITER})",
                )
        for name in np_.keys() - op.keys():
            if name in nreq:
                self.add(f"{at}{name}", "new_required_field", f"an older writer does not send it ({OLD_WRITER})")
            elif old.get("additionalProperties") is False:
                self.add(
                    f"{at}{name}",
                    "field_refused",
                    f"an older reader refuses fields it does not know (additionalProperties: false) ({NEW_WRITER})",
                )
            else:
                self.add(
                    f"{at}{name}", "new_optional_field", "an older reader ignores it, an older writer leaves it out"
                )
        oa, na = old.get("additionalProperties"), new.get("additionalProperties")
        if isinstance(oa, dict) and isinstance(na, dict):
            self.compare(f"{at}*", oa, na)
        elif na is False and oa is not False and ("properties" in old or "properties" in new):
            self.add(path, "narrowed", f"refuses fields it does not name now ({OLD_WRITER})")


def compare_schemas(
    contract: str, old: Json, new: Json, old_root: Json | None = None, new_root: Json | None = None
) -> list[Finding]:
    """Every difference between two versions of one JSON Schema that a reader or writer of the other would notice."""
    walk = _Walk(contract, old if old_root is None else old_root, new if new_root is None else new_root)
    walk.compare("", old, new)
    return _unique(walk.out)


def _unique(findings: Iterable[Finding]) -> list[Finding]:
    return list(dict.fromkeys(findings))


# --- subjects: the AsyncAPI channels and the catalogue ---------------------------------------------------------------

_VERSIONED = re.compile(r"^lw\.v(\d+)\.(.+)$")


def successor(address: str, addresses: Iterable[str]) -> str | None:
    """A later version of ``address`` among ``addresses`` (``lw.v2.x`` for ``lw.v1.x``), if any."""
    m = _VERSIONED.match(address)
    if m is None:
        return None
    for other in addresses:
        n = _VERSIONED.match(other)
        if n is not None and n.group(2) == m.group(2) and int(n.group(1)) > int(m.group(1)):
            return other
    return None


def channels(doc: Json) -> dict[tuple[str, str], set[str]]:
    """(address, send|receive) -> the contracts its messages carry, from an AsyncAPI 3 document."""
    out: dict[tuple[str, str], set[str]] = {}
    for op in (doc.get("operations") or {}).values():
        channel = resolve(doc, op["channel"]["$ref"])
        names = out.setdefault((channel.get("address") or "", op.get("action", "")), set())
        for message in (channel.get("messages") or {}).values():
            payload = _deref(doc, message)[0].get("payload") or {}
            names.add(str(payload.get("$ref", "inline")).rsplit("/", 1)[-1])
    return out


def _same_shape(old: Json, name: str, new: Json, others: Iterable[str]) -> str | None:
    """One of ``others`` (schemas of ``new``) that accepts what ``name`` of ``old`` described, if any."""
    old_schema = ((old.get("components") or {}).get("schemas") or {}).get(name)
    new_schemas = (new.get("components") or {}).get("schemas") or {}
    for other in sorted(others):
        if old_schema is not None and other in new_schemas:
            if not breaking(compare_schemas(name, old_schema, new_schemas[other], old, new)):
                return other
    return None


def compare_asyncapi(old: Json, new: Json, message_contracts: Iterable[str] = ()) -> list[Finding]:
    """Channels the last release used that are gone or carry other contracts; the schemas that are no
    message contract of their own (those are compared as contracts)."""
    found: list[Finding] = []
    oc, nc = channels(old), channels(new)
    old_addresses = {a for a, _ in oc}
    for (address, action), names in sorted(oc.items()):
        where = f"channel {address} ({action})"
        if (address, action) not in nc:
            later = successor(address, old_addresses)
            if later is not None:
                found.append(Finding(where, "", "retired_subject", f"the last release served {later} already"))
            else:
                who = "publishes on it" if action == "send" else "consumes it"
                found.append(
                    Finding(
                        where,
                        "",
                        "removed_subject",
                        f"a service of the last release still {who}; serve lw.v<n+1> beside it for a release first",
                    )
                )
            continue
        for name in sorted(names - nc[(address, action)]):
            same = _same_shape(old, name, new, nc[(address, action)] - names)
            if same is not None:
                found.append(Finding(where, "", "versioned", f"carries {name}'s shape as {same}"))
            else:
                why = f"no longer carries {name}, which the last release's services use"
                found.append(Finding(where, "", "payload_changed", why))
        for name in sorted(nc[(address, action)] - names):
            found.append(
                Finding(where, "", "widened", f"now also carries {name}: upgrade its readers first ({NEW_WRITER})")
            )
    for address, action in sorted(nc.keys() - oc.keys()):
        found.append(Finding(f"channel {address} ({action})", "", "new_subject", "older services do not use it"))
    skip = set(message_contracts)
    old_schemas = (old.get("components") or {}).get("schemas") or {}
    new_schemas = (new.get("components") or {}).get("schemas") or {}
    for name, schema in sorted(old_schemas.items()):
        if name in skip:
            continue
        if name not in new_schemas:
            if any(name in names for names in oc.values()):
                found.append(
                    Finding(f"asyncapi {name}", "", "removed_contract", "a channel of the last release carries it")
                )
            continue
        found.extend(compare_schemas(f"asyncapi {name}", schema, new_schemas[name], old, new))
    return _unique(found)


def compare_catalogue(old: Json, new: Json) -> list[Finding]:
    """``schemas/messages/catalogue.json``: which contract travels on which subject (incl. KV buckets)."""
    found: list[Finding] = []
    os_, ns = old.get("subjects") or {}, new.get("subjects") or {}
    for subject, contract in os_.items():
        if subject not in ns:
            later = successor(subject, os_)
            kind: Kind = "retired_subject" if later else "removed_subject"
            why = f"the last release served {later} already" if later else "the last release's services still use it"
            found.append(Finding("catalogue", subject, kind, why))
        elif ns[subject] != contract:
            found.append(Finding("catalogue", subject, "payload_changed", f"carried {contract}, now {ns[subject]}"))
    for subject in ns.keys() - os_.keys():
        found.append(Finding("catalogue", subject, "new_subject", "older services do not use it"))
    return found


# --- a release's contracts against the current ones ------------------------------------------------------------------


@dataclass(frozen=True)
class Contracts:
    """A release's contracts as data: message schemas by name, the catalogue, the AsyncAPI document."""

    messages: dict[str, Json]
    catalogue: Json
    asyncapi: Json

    @classmethod
    def load(cls, root: Path) -> Contracts:
        """From ``root``/messages/*.json and ``root``/asyncapi.json (``schemas/`` or a release's snapshot)."""
        messages = {p.stem: json.loads(p.read_text()) for p in sorted((root / "messages").glob("*.json"))}
        catalogue = messages.pop(Path(CATALOGUE).stem, {})
        return cls(messages, catalogue, json.loads((root / "asyncapi.json").read_text()))


def _excused(name: str, old: Contracts, new: Contracts) -> str | None:
    """Why breaking changes to message contract ``name`` are allowed, if they are: every channel that
    carried it still carries its old shape (under another name) and it travels on a later subject version."""
    oc, nc = channels(old.asyncapi), channels(new.asyncapi)
    carriers = [key for key, names in oc.items() if name in names]
    if not carriers:
        return None
    old_schema = old.messages[name]
    new_schemas = (new.asyncapi.get("components") or {}).get("schemas") or {}
    kept: list[str] = []
    for key in carriers:
        shape = None
        for other in sorted(nc.get(key, set()) - {name}):
            schema = new.messages.get(other) or new_schemas.get(other)
            root = new.messages.get(other) or new.asyncapi
            if schema is not None and not [
                f for f in compare_schemas(name, old_schema, schema, old_schema, root) if f.breaking
            ]:
                shape = other
                break
        if shape is None:
            return None
        kept.append(f"{key[0]} carries it as {shape}")
    later = [
        s for key in carriers if (s := successor(key[0], {a for a, _ in nc})) and name in nc.get((s, key[1]), set())
    ]
    if not later:
        return None
    return f"served on {later[0]} beside the old subject ({'; '.join(sorted(set(kept)))})"


def compare(old: Contracts, new: Contracts) -> list[Finding]:
    """Every finding between a release's contracts and the current ones (breaking or not)."""
    found: list[Finding] = []
    for name, schema in sorted(old.messages.items()):
        if name not in new.messages:
            why = _excused(name, old, new)
            if why:
                found.append(Finding(name, "", "versioned", why))
            else:
                found.append(
                    Finding(name, "", "removed_contract", "the last release's services still write or read it")
                )
            continue
        changes = compare_schemas(name, schema, new.messages[name])
        if any(f.breaking for f in changes) and (why := _excused(name, old, new)):
            changes = [
                Finding(f.contract, f.field, "versioned", f"{f.why} - {why}") if f.breaking else f for f in changes
            ]
        found.extend(changes)
    for name in sorted(new.messages.keys() - old.messages.keys()):
        found.append(Finding(name, "", "new_contract", "older services do not use it"))
    found.extend(compare_catalogue(old.catalogue, new.catalogue))
    found.extend(compare_asyncapi(old.asyncapi, new.asyncapi, old.messages.keys() | new.messages.keys()))
    return found


def breaking(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.breaking]


def report(findings: Iterable[Finding], release: str) -> str:
    """The breaking findings as the test and the CLI print them."""
    bad = breaking(findings)
    lines = [f"{len(bad)} contract change(s) the release {release} services cannot handle:"]
    lines += [f"  {f}" for f in bad]
    lines.append("bump the subject (lw.v2...) and serve both versions through a release, or make the change additive")
    return "\n".join(lines)


# --- releases on disk ------------------------------------------------------------------------------------------------


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split(".dev")[0])[:3])


def releases(root: Path = RELEASES) -> list[str]:
    """The released versions with a contract snapshot, oldest first."""
    return (
        sorted((p.name for p in root.iterdir() if (p / "asyncapi.json").is_file()), key=_key) if root.is_dir() else []
    )


def snapshot(version: str, source: Path = SCHEMAS, root: Path = RELEASES) -> Path:
    """Copy the current contracts (messages and AsyncAPI) to ``root/<version>``."""
    if ".dev" in version or "+" in version:
        raise SystemExit(f"snapshot: {version} is not a release version; set pyproject.toml's version to the release")
    out = root / version
    if out.exists():
        shutil.rmtree(out)
    (out / "messages").mkdir(parents=True)
    for path in sorted((source / "messages").glob("*.json")):
        shutil.copyfile(path, out / "messages" / path.name)
    shutil.copyfile(source / "asyncapi.json", out / "asyncapi.json")
    return out


def _iter_lines(findings: list[Finding]) -> Iterator[str]:
    for f in findings:
        yield f"{'BREAKING' if f.breaking else 'ok'}  {f}"


def command(args: list[str]) -> int:
    """``snapshot`` or ``check`` (``python -m loopwarden.generate snapshot|check``)."""
    from shared.version import package_version

    if args[:1] == ["snapshot"]:
        out = snapshot(package_version())
        print(f"wrote the contracts of {package_version()} to {out.relative_to(ROOT)}")
        return 0
    if args[:1] == ["check"]:
        known = releases()
        if not known:
            print("no release snapshot in schemas/releases", file=sys.stderr)
            return 2
        findings = compare(Contracts.load(RELEASES / known[-1]), Contracts.load(SCHEMAS))
        print("\n".join(_iter_lines(findings)) or f"no contract changes since {known[-1]}")
        return 1 if breaking(findings) else 0
    print("usage: python -m loopwarden.generate [snapshot|check]", file=sys.stderr)
    return 2
