"""Reading a stored golden set: its manifest checked field by field, each case's file
checked against the manifest's size and sha256, and its arrays read back."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import numpy as np

from ..cases import Case
from .format import ARRAYS, MANIFEST, SCHEMA, SCHEMA_VERSION, GoldenError, sha256, show_path


@dataclasses.dataclass
class Problem:
    file: str
    kind: str       # missing | truncated | corrupted | unreadable | schema | inputs | semantics
    message: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


_CASE_FIELDS = {"id": str, "file": str, "bytes": int, "sha256": str, "inputs_sha256": str,
                "seed": int, "params": dict, "shape": list}


def read_manifest(root: Path) -> tuple[dict | None, list[Problem]]:
    """The manifest if it is readable and well-formed, else the problems with it."""
    path = root / MANIFEST
    if not root.is_dir():
        return None, [Problem(MANIFEST, "missing",
                              f"{show_path(root)}: no such golden directory")]
    try:
        text = path.read_bytes().decode()
    except FileNotFoundError:
        return None, [Problem(MANIFEST, "missing", f"{show_path(path)}: missing")]
    except (OSError, UnicodeDecodeError) as exc:
        return None, [Problem(MANIFEST, "unreadable", f"{show_path(path)}: unreadable ({exc})")]
    try:
        man = json.loads(text)
    except json.JSONDecodeError as exc:
        # a manifest is one JSON object: text that stops before its closing brace was cut
        kind = "corrupted" if text.rstrip().endswith("}") else "truncated"
        return None, [Problem(MANIFEST, kind, f"{show_path(path)}: not valid JSON ({kind}: "
                                              f"{exc.msg} at line {exc.lineno})")]
    probs = _header_problems(man, path)
    if not probs:
        probs = _case_problems(man["cases"], path)
    return (None, probs) if probs else (man, [])


def _header_problems(man, path: Path) -> list[Problem]:
    """The schema and the top-level fields; the first wrong one ends the reading."""
    if not isinstance(man, dict):
        return [Problem(MANIFEST, "schema", f"{show_path(path)}: not a JSON object")]
    if man.get("schema") != SCHEMA or man.get("schema_version") != SCHEMA_VERSION:
        return [Problem(MANIFEST, "schema",
                        f"{show_path(path)}: schema {man.get('schema')!r} version "
                        f"{man.get('schema_version')!r}; this sdpa_probe reads {SCHEMA} "
                        f"version {SCHEMA_VERSION}")]
    return [Problem(MANIFEST, "schema",
                    f"{show_path(path)}: field {key!r} missing or not a {typ.__name__}")
            for key, typ in (("generator", dict), ("versions", dict), ("semantics", dict),
                             ("cases", list))
            if not isinstance(man.get(key), typ)]


def _case_problems(cases: list, path: Path) -> list[Problem]:
    """Every case entry: its fields, a unique id, a plain file name, and parameters that
    still give its id."""
    probs = []
    seen = set()
    for i, ent in enumerate(cases):
        bad = [k for k, t in _CASE_FIELDS.items()
               if not isinstance(ent, dict) or not isinstance(ent.get(k), t)]
        if bad:
            probs.append(Problem(MANIFEST, "schema", f"{show_path(path)}: cases[{i}] lacks a "
                                                     f"valid {', '.join(bad)}"))
            continue
        if ent["id"] in seen:
            probs.append(Problem(MANIFEST, "schema",
                                 f"{show_path(path)}: case {ent['id']} listed twice"))
        seen.add(ent["id"])
        if Path(ent["file"]).name != ent["file"]:
            probs.append(Problem(MANIFEST, "schema",
                                 f"{show_path(path)}: cases[{i}] file {ent['file']!r} is not a "
                                 f"plain file name"))
            continue
        try:
            case = Case(**ent["params"])
        except (TypeError, ValueError) as exc:
            probs.append(Problem(MANIFEST, "schema", f"{show_path(path)}: case {ent['id']}: bad "
                                                     f"parameters ({exc})"))
            continue
        if case.id != ent["id"]:
            probs.append(Problem(MANIFEST, "schema",
                                 f"{show_path(path)}: case {ent['id']}: its parameters now give "
                                 f"the id {case.id} (case ids changed; regenerate)"))
    return probs


def check_blob(root: Path, ent: dict) -> tuple[bytes | None, Problem | None]:
    """The file's bytes if they match the manifest's size and sha256."""
    name = ent["file"]
    path = root / name
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None, Problem(name, "missing", f"{show_path(path)}: missing (case {ent['id']})")
    except OSError as exc:
        return None, Problem(name, "unreadable",
                             f"{show_path(path)}: unreadable ({exc.strerror})")
    if len(blob) < ent["bytes"]:
        return None, Problem(name, "truncated", f"{show_path(path)}: truncated ({len(blob)} of "
                                                f"{ent['bytes']} bytes)")
    if len(blob) > ent["bytes"]:
        return None, Problem(name, "corrupted", f"{show_path(path)}: {len(blob)} bytes, the "
                                                f"manifest says {ent['bytes']} (corrupted)")
    if sha256(blob) != ent["sha256"]:
        return None, Problem(name, "corrupted", f"{show_path(path)}: sha256 mismatch (corrupted: "
                                                f"the bytes differ from those recorded)")
    return blob, None


def parse_blob(name: str, blob: bytes, ent: dict) -> tuple[np.ndarray, float | None]:
    """ref and torch_err out of .npz bytes; GoldenError if the content is not as recorded."""
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            if sorted(z.files) != sorted(ARRAYS):
                raise GoldenError(f"{name}: holds {sorted(z.files)}, expected {list(ARRAYS)}")
            ref, terr = z["ref"], z["torch_err"]
    except GoldenError:
        raise
    except Exception as exc:  # zipfile.BadZipFile, ValueError from a bad .npy header, ...
        raise GoldenError(f"{name}: not a readable .npz ({type(exc).__name__}: {exc})") from None
    if ref.dtype != np.float64 or list(ref.shape) != list(ent["shape"]):
        raise GoldenError(f"{name}: ref is {ref.dtype} {list(ref.shape)}, expected float64 "
                          f"{ent['shape']}")
    if terr.shape != () or terr.dtype != np.float64:
        raise GoldenError(f"{name}: torch_err is {terr.dtype} {list(terr.shape)}, expected a "
                          f"float64 scalar")
    t = float(terr)
    return ref, (None if math.isnan(t) else t)


def inputs_mismatch(ent: dict, man: dict) -> str:
    """Why a case's regenerated inputs are not the ones its reference was made from."""
    return (f"{ent['file']}: the inputs regenerated from seed {ent['seed']} differ from those "
            f"the reference was computed from (numpy {np.__version__} now, "
            f"{man['versions'].get('numpy')} at generation); regenerate and review")
