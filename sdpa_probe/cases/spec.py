"""A case written out in full as a one-line spec, `family=fuzz,q_len=3,kv_len=5,mask=random`:
its fields that differ from Case's defaults, each as key=value. Any case, one of the
suites' or a generated one, round-trips through its spec (`probe check --case SPEC`,
a corpus file); an id names a case only where a suite has it."""

from __future__ import annotations

import dataclasses

from .case import Case

_FIELDS = {f.name: f for f in dataclasses.fields(Case)}


def spec_of(case: Case) -> str:
    """The case's fields that differ from the defaults, family first; floats as repr
    (exact)."""
    out = [f"family={case.family}"]
    for name, f in _FIELDS.items():
        value = getattr(case, name)
        if name == "family" or value == f.default:
            continue
        if isinstance(value, bool):
            value = int(value)
        out.append(f"{name}={value!r}" if isinstance(value, float) else f"{name}={value}")
    return ",".join(out)


def _value(name: str, text: str):
    default = _FIELDS[name].default
    kind = str if default is dataclasses.MISSING else type(default)
    if kind is bool:
        if text not in ("0", "1", "true", "false"):
            raise ValueError(f"{name}: 0 or 1, got {text!r}")
        return text in ("1", "true")
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name}: not a {kind.__name__}: {text!r}") from None


def is_spec(text: str) -> bool:
    return "=" in text


def parse_spec(text: str) -> Case:
    """The case a spec writes out; ValueError (one line) for a field Case does not
    have, a value of the wrong kind or a case Case refuses."""
    fields: dict = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in _FIELDS:
            known = ", ".join(_FIELDS)
            raise ValueError(f"{part!r} is not key=value with a case field ({known})")
        if name in fields:
            raise ValueError(f"{name} given twice")
        fields[name] = _value(name, value.strip())
    if "family" not in fields:
        raise ValueError("a case spec names its family (family=...)")
    return Case(**fields)
