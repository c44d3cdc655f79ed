"""Reading a stored golden set: its manifest checked field by field, each case's file
checked against the manifest's size and sha256, its arrays read back, and its whole
record (manifest entry, header and arrays) against its record_sha256."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import numpy as np

from ..cases import Case
from .format import (
    ARRAYS,
    DEFAULT_SUITE,
    MANIFEST,
    SCHEMA,
    SCHEMA_VERSION,
    UNHASHED,
    GoldenError,
    default_dir,
    header_digest,
    record_digest,
    sha256,
    show_path,
    summary,
)


@dataclasses.dataclass
class Problem:
    file: str
    # missing | truncated | corrupted | unreadable | schema | record | inputs | semantics
    # | reference | torch_err
    kind: str
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
        probs = _case_problems(man["cases"], path, is_hashed(man))
    return (None, probs) if probs else (man, [])


def _header_problems(man, path: Path) -> list[Problem]:
    """The schema and the top-level fields; the first wrong one ends the reading."""
    if not isinstance(man, dict):
        return [Problem(MANIFEST, "schema", f"{show_path(path)}: not a JSON object")]
    schema = (man.get("schema"), man.get("schema_version"))
    if schema not in ((SCHEMA, SCHEMA_VERSION), UNHASHED):
        return [Problem(MANIFEST, "schema",
                        f"{show_path(path)}: schema {schema[0]!r} version {schema[1]!r}; "
                        f"this sdpa_probe reads {SCHEMA} version {SCHEMA_VERSION} (and "
                        f"{UNHASHED[0]} version {UNHASHED[1]}, to regenerate it)")]
    fields = [("generator", dict), ("versions", dict), ("semantics", dict), ("cases", list)]
    if is_hashed(man):
        fields.append(("header_sha256", str))
    return [Problem(MANIFEST, "schema",
                    f"{show_path(path)}: field {key!r} missing or not a {typ.__name__}")
            for key, typ in fields if not isinstance(man.get(key), typ)]


def is_hashed(man: dict) -> bool:
    """Whether a manifest hashes each case's record (schema version 2 on)."""
    return (man.get("schema"), man.get("schema_version")) != UNHASHED


def _case_problems(cases: list, path: Path, hashed: bool) -> list[Problem]:
    """Every case entry: its fields, a unique id, a plain file name, and parameters that
    still give its id."""
    probs = []
    seen = set()
    required = {**_CASE_FIELDS, "record_sha256": str} if hashed else _CASE_FIELDS
    for i, ent in enumerate(cases):
        bad = [k for k, t in required.items()
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


class CaseProblem(GoldenError):
    """A stored case that cannot be used, as the Problem verify reports."""

    def __init__(self, problem: Problem):
        super().__init__(problem.message)
        self.problem = problem


def read_case(root: Path, ent: dict) -> tuple[np.ndarray, float | None]:
    """ref and torch_err of a stored case, its file as recorded (size, sha256, arrays);
    CaseProblem otherwise."""
    blob, prob = check_blob(root, ent)
    if prob:
        raise CaseProblem(prob)
    try:
        return parse_blob(show_path(root / ent["file"]), blob, ent)
    except GoldenError as exc:
        raise CaseProblem(Problem(ent["file"], "unreadable", str(exc))) from None


def record_problems(man: dict, ent: dict, ref: np.ndarray,
                    torch_err: float | None) -> list[Problem]:
    """A case's record against its digest (a manifest field or an array edited without
    it), and the entry's fields against the arrays they describe (an edit that updated
    the digest but not both)."""
    probs = []
    where = f"{MANIFEST}: case {ent['id']}"
    if is_hashed(man) and record_digest(ent, man["header_sha256"], ref,
                                         torch_err) != ent["record_sha256"]:
        probs.append(Problem(ent["file"], "record",
                             f"{where}: its record (manifest entry, header and arrays) does "
                             f"not match its record_sha256 (edited after it was made)"))
    for key, val in summary(ref, torch_err).items():
        if key in ent and ent[key] != val:
            probs.append(Problem(ent["file"], "record",
                                 f"{where}: the manifest says {key} = {ent[key]!r}, "
                                 f"{ent['file']} holds {val!r}"))
    return probs


def header_problems(man: dict, root: Path) -> list[Problem]:
    """The manifest's header against its digest; an unhashed (version 1) manifest."""
    path = show_path(root / MANIFEST)
    if not is_hashed(man):
        return [Problem(MANIFEST, "schema",
                        f"{path}: schema version {UNHASHED[1]} does not hash each case's "
                        f"record; rewrite it with {regen_command(man, root)}")]
    if header_digest(man) != man["header_sha256"]:
        return [Problem(MANIFEST, "record",
                        f"{path}: its header (schema, generator, versions, semantics, suite) "
                        f"does not match its header_sha256 (edited after it was made)")]
    return []


def regen_command(man: dict, root: Path) -> str:
    """The command that rewrites this set as it is (the same cases)."""
    argv = ["probe golden regen"]
    if Path(root).resolve() != default_dir().resolve():
        argv.append(f"--dir {show_path(root)}")
    if man.get("suite") is None:
        argv.append("--cases " + ",".join(e["id"] for e in man["cases"]))
    elif man["suite"] != DEFAULT_SUITE:
        argv.append(f"--suite {man['suite']}")
    return " ".join(argv)


def load_case(root: Path, man: dict, ent: dict) -> tuple[np.ndarray, float | None]:
    """A stored case's ref and torch_err, its file and record as recorded; CaseProblem
    naming the first thing that is not."""
    ref, terr = read_case(root, ent)
    probs = record_problems(man, ent, ref, terr)
    if probs:
        raise CaseProblem(probs[0])
    return ref, terr
