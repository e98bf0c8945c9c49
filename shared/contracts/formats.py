"""The ``format`` values this runtime asserts, one implementation for both validators.

``format`` is an annotation unless a validator asserts it, and the two engines we use
(jsonschema-rs for the fast pass/fail, python-jsonschema to explain) ship different
format sets. Giving both the same functions keeps their answers identical. Formats outside
this set stay annotations, as the spec says; ``loopwarden lint`` points them out.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from datetime import date, datetime

from shared.contracts.ecma import is_regex

# ASCII only and anchored at the very end (``\Z``): ``$`` would accept a trailing newline and
# ``\d`` any Unicode digit ("12:3৪:00" is not a time).
_A = re.ASCII
_DATE_TIME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})\Z", _A)
_TIME = re.compile(r"^(\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-](\d{2}):(\d{2}))\Z", _A)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}\Z", _A)
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:[^\s]*\Z")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\Z")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")
_URI_REFERENCE = re.compile(r"^[^\s]*\Z")
_JSON_POINTER = re.compile(r"^(/([^~/]|~[01])*)*\Z")
_RELATIVE_JSON_POINTER = re.compile(r"^(0|[1-9][0-9]*)(#|(/([^~/]|~[01])*)*)\Z")
_DURATION = re.compile(r"^P(?!\Z)((\d+Y)?(\d+M)?(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?|\d+W)\Z", _A)


def _date(value: str) -> bool:
    if not _DATE.match(value):
        return False
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return True


def _date_time(value: str) -> bool:
    m = _DATE_TIME.match(value)
    if not m or not _date(f"{m[1]}-{m[2]}-{m[3]}"):
        return False
    hour, minute, second = int(m[4]), int(m[5]), int(m[6])
    if hour > 23 or minute > 59 or second > 60:
        return False
    tz = m[8]
    if tz not in ("Z", "z") and (int(tz[1:3]) > 23 or int(tz[4:6]) > 59):
        return False
    try:
        datetime.fromisoformat(f"{m[1]}-{m[2]}-{m[3]}T{m[4]}:{m[5]}:{min(second, 59):02d}")
    except ValueError:
        return False
    return True


def _time(value: str) -> bool:
    m = _TIME.match(value)
    if not m:
        return False
    if int(m[1]) > 23 or int(m[2]) > 59 or int(m[3]) > 60:
        return False
    return not (m[6] and (int(m[6]) > 23 or int(m[7]) > 59))


def _ipv4(value: str) -> bool:
    parts = value.split(".")
    if len(parts) != 4 or any(not (p.isascii() and p.isdigit()) or (len(p) > 1 and p[0] == "0") for p in parts):
        return False
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True


def _ipv6(value: str) -> bool:
    if not value.isascii():
        return False
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return "%" not in value


def _hostname(value: str) -> bool:
    if not value or len(value) > 253:
        return False
    labels = value[:-1].split(".") if value.endswith(".") else value.split(".")
    return all(_HOST_LABEL.match(label) for label in labels)


_STRING_CHECKS: dict[str, Callable[[str], bool]] = {
    "date-time": _date_time,
    "date": _date,
    "time": _time,
    "email": lambda v: bool(_EMAIL.match(v)),
    "uri": lambda v: bool(_URI.match(v)),
    "uuid": lambda v: bool(_UUID.match(v)),
    "ipv4": _ipv4,
    "ipv6": _ipv6,
    "hostname": _hostname,
    "regex": is_regex,
    "uri-reference": lambda v: bool(_URI_REFERENCE.match(v)),
    "iri": lambda v: bool(_URI.match(v)),
    "iri-reference": lambda v: bool(_URI_REFERENCE.match(v)),
    "idn-email": lambda v: bool(_EMAIL.match(v)),
    "idn-hostname": lambda v: bool(v) and len(v) <= 253 and not any(c.isspace() for c in v),
    "json-pointer": lambda v: bool(_JSON_POINTER.match(v)),
    "relative-json-pointer": lambda v: bool(_RELATIVE_JSON_POINTER.match(v)),
    "duration": lambda v: bool(_DURATION.match(v)),
    "uri-template": lambda v: v.count("{") == v.count("}") and not any(c.isspace() for c in v),
}
SUPPORTED_FORMATS = frozenset(_STRING_CHECKS)


def _any_value(check: Callable[[str], bool]) -> Callable[[object], bool]:
    # JSON Schema formats constrain strings only; other types pass.
    def wrapped(value: object) -> bool:
        return check(value) if isinstance(value, str) else True

    return wrapped


FORMAT_FUNCTIONS: dict[str, Callable[[object], bool]] = {k: _any_value(f) for k, f in _STRING_CHECKS.items()}
# jsonschema-rs calls custom format functions with strings only.
RS_FORMAT_FUNCTIONS: dict[str, Callable[[str], bool]] = dict(_STRING_CHECKS)
