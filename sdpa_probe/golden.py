"""Golden data: stored float64 oracle outputs for a subset of the case matrix, so
tests and `probe check --golden` need no oracle (and no torch SDPA) call, and a
change in what the oracle returns (a new torch, a new machine, an edited
reference) shows up as a reviewed diff instead of being inherited silently.

Layout of a golden directory (docs/golden.md):

    manifest.json        schema, versions, semantics, and per case: id, parameters,
                         seed, file, size, sha256 of the file, sha256 of the inputs
    <case id>.npz        `ref` float64 [B, Lq, H, D] and `torch_err` float64 scalar
                         (NaN: torch has no path for the dtype)

Inputs are not stored: `inputs.materialise(case)` regenerates them from the seed,
and the manifest's `inputs_sha256` proves they are the inputs the reference was
computed from. The .npz files are written without compression and with fixed zip
metadata, so the same arrays always give the same bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from . import __version__
from .cases import SUITES, Case, all_cases, judged_tolerance, suite, tolerance
from .errors import ProbeError

SCHEMA = "sdpa_probe.golden/1"
SCHEMA_VERSION = 1
GENERATOR = {"name": "sdpa_probe.golden", "version": __version__, "format": 1}
MANIFEST = "manifest.json"
DEFAULT_SUITE = "default"
# A regenerated reference "changed" when an element moved by more than this fraction
# of the case's kernel tolerance (atol + rtol * |ref|): far below what could flip a
# verdict, far above float64 rounding (~1e-16) between machines or torch builds.
DRIFT_FRACTION = 0.01
# torch's own error floors each case's atol (cases.judged_tolerance, as verdict.judge);
# a change of that effective atol by more than this fraction counts as a change.
TORCH_ERR_DRIFT = 0.10
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_ARRAYS = ("ref", "torch_err")


class GoldenError(ProbeError):
    """The golden data cannot be used (missing, corrupted, or lacks a case)."""


def default_dir() -> Path:
    """$SDPA_PROBE_GOLDEN, else the checkout's golden/, else ./golden."""
    env = os.environ.get("SDPA_PROBE_GOLDEN")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[1] / "golden"
    if repo.is_dir():
        return repo
    return Path("golden")


def _show(path: Path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


# ---- deterministic bytes ----------------------------------------------------------

def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")
    np.lib.format.write_array(buf, arr, version=(1, 0),
                              allow_pickle=False)
    return buf.getvalue()


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz (a zip of .npy members) whose bytes depend only on the arrays: members
    in name order, stored uncompressed, fixed date, mode and creator system."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3
            info.external_attr = 0o100644 << 16
            zf.writestr(info, _npy(arrays[name]))
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def inputs_digest(data) -> str:
    """sha256 over everything a kernel and the oracle get: real q/k/v values, the mask,
    and the storage arrays (int8 data, scales and zero points included)."""
    from .native import QuantTensor

    h = hashlib.sha256()

    def add(name: str, a) -> None:
        if a is None:
            h.update(f"{name}:none;".encode())
            return
        a = np.ascontiguousarray(a)
        h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.tobytes())

    for name in ("q", "k", "v"):
        add(name, getattr(data, name).numpy())
    add("mask", data.mask)
    for name in ("q_store", "k_store", "v_store"):
        st = getattr(data, name)
        if isinstance(st, QuantTensor):
            add(f"{name}.data", st.data)
            add(f"{name}.scale", st.scale)
            add(f"{name}.zero_point", st.zero_point)
        else:
            add(name, st)
    return h.hexdigest()


# ---- what the oracle encodes ------------------------------------------------------

def semantics() -> dict:
    """The conventions the reference encodes, observed from the live oracle (not
    asserted), so an oracle that changes them shows up as a semantics change."""
    import torch

    from .reference import bias_matrix, sdpa_reference

    q = torch.ones(1, 2, 1, 2, dtype=torch.float64)
    kv = torch.ones(1, 3, 1, 2, dtype=torch.float64)
    mask = torch.tensor([[0.0, 0.0, 0.0], [-math.inf] * 3])
    row = sdpa_reference(q, kv, kv, mask=mask)[0, 1, 0]
    if bool(torch.all(row == 0)):
        masked = "zeros"
    elif bool(torch.all(torch.isnan(row))):
        masked = "nan"
    else:
        masked = "other: " + ", ".join(f"{x:g}" for x in row.tolist())
    vis = torch.isfinite(bias_matrix(3, 6, is_causal=True, start_pos=2)).numpy()
    i, j = np.arange(3)[:, None], np.arange(6)[None, :]
    if (vis == (j <= 2 + i)).all():
        causal = "query row i sees key j iff j <= start_pos + i (bottom-right when " \
                 "start_pos = kv_len - q_len)"
    else:
        causal = "other: " + str(vis.astype(int).tolist())
    return {"fully_masked_rows": masked, "causal_alignment": causal,
            "gqa": "kv head of query head h = h // (n_heads / n_kv_heads)",
            "mask": "additive float32 [q_len, kv_len] on the scaled logits; -inf hides a key",
            "scale": "scale <= 0 means 1/sqrt(head_dim)",
            "reference": "float64, [batch, q_len, n_heads, head_dim], from the stored "
                         "(rounded / dequantised) input values",
            "torch_err": "max |torch SDPA in the storage dtype - reference| (NaN: no torch path)"}


def versions() -> dict:
    import torch

    from .build import cpu_model

    # torch's CPU kernels, and so torch_err, differ by the ISA they dispatch to
    # (AVX2 / AVX512) and, through its BLAS's per-vendor and per-model code paths,
    # by the CPU: the same torch read 1.15e-06 on a Zen 5 and 2.5e-06 on a Xeon,
    # both AVX512. A torch_err recorded on another CPU is not comparable.
    return {"torch": torch.__version__, "numpy": np.__version__,
            "torch_cpu": torch.backends.cpu.get_cpu_capability(), "cpu": cpu_model()}


def torch_err_comparable(man_a: dict | None, man_b: dict | None) -> bool:
    """Whether torch_err values recorded under these two manifests' versions can be
    compared: the same torch CPU capability (ISA) and CPU model, both recorded."""
    va = (man_a or {}).get("versions") or {}
    vb = (man_b or {}).get("versions") or {}
    return all(va.get(k) is not None and va.get(k) == vb.get(k) for k in ("torch_cpu", "cpu"))


# ---- generating --------------------------------------------------------------------

@dataclasses.dataclass
class Entry:
    """One case's golden data, in memory."""

    case: Case
    ref: np.ndarray
    torch_err: float | None
    inputs_sha256: str
    blob: bytes | None = None

    @property
    def file(self) -> str:
        return f"{self.case.id}.npz"

    def to_bytes(self) -> bytes:
        if self.blob is None:
            terr = np.float64(np.nan if self.torch_err is None else self.torch_err)
            self.blob = npz_bytes({"ref": self.ref.astype(np.float64), "torch_err": terr})
        return self.blob

    def manifest_entry(self) -> dict:
        blob = self.to_bytes()
        ref = self.ref
        rows = ref.reshape(-1, ref.shape[-1]) if ref.size else ref.reshape(0, 1)
        finite = np.isfinite(ref)
        return {"id": self.case.id, "file": self.file, "bytes": len(blob),
                "sha256": sha256(blob), "inputs_sha256": self.inputs_sha256,
                "seed": self.case.seed, "params": self.case.params(),
                "shape": list(ref.shape), "torch_err": self.torch_err,
                "zero_rows": int((rows == 0).all(axis=-1).sum()),
                "nonfinite": int((~finite).sum()),
                "max_abs": float(np.abs(ref[finite]).max()) if finite.any() else 0.0}


def generate(case: Case) -> Entry:
    """Inputs from the seed, the float64 oracle, and torch's own error."""
    from .backends import torch_error
    from .inputs import materialise
    from .reference import sdpa_reference

    data = materialise(case)
    ref = sdpa_reference(data.q, data.k, data.v, mask=data.mask_t, is_causal=case.causal,
                         start_pos=case.start_pos, scale=case.scale).numpy()
    return Entry(case, ref, torch_error(data, ref), inputs_digest(data))


def build_manifest(entries: Iterable[Entry], suite_name: str | None) -> dict:
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "generator": dict(GENERATOR),
            "versions": versions(), "semantics": semantics(), "suite": suite_name,
            "cases": [e.manifest_entry() for e in sorted(entries, key=lambda e: e.case.id)]}


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1, allow_nan=False) + "\n").encode()


# ---- reading -----------------------------------------------------------------------

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
        return None, [Problem(MANIFEST, "missing", f"{_show(root)}: no such golden directory")]
    try:
        text = path.read_bytes().decode()
    except FileNotFoundError:
        return None, [Problem(MANIFEST, "missing", f"{_show(path)}: missing")]
    except (OSError, UnicodeDecodeError) as exc:
        return None, [Problem(MANIFEST, "unreadable", f"{_show(path)}: unreadable ({exc})")]
    try:
        man = json.loads(text)
    except json.JSONDecodeError as exc:
        # a manifest is one JSON object: text that stops before its closing brace was cut
        kind = "corrupted" if text.rstrip().endswith("}") else "truncated"
        return None, [Problem(MANIFEST, kind, f"{_show(path)}: not valid JSON ({kind}: "
                                              f"{exc.msg} at line {exc.lineno})")]
    probs = []
    if not isinstance(man, dict):
        return None, [Problem(MANIFEST, "schema", f"{_show(path)}: not a JSON object")]
    if man.get("schema") != SCHEMA or man.get("schema_version") != SCHEMA_VERSION:
        return None, [Problem(MANIFEST, "schema",
                              f"{_show(path)}: schema {man.get('schema')!r} version "
                              f"{man.get('schema_version')!r}; this sdpa_probe reads {SCHEMA} "
                              f"version {SCHEMA_VERSION}")]
    for key, typ in (("generator", dict), ("versions", dict), ("semantics", dict),
                     ("cases", list)):
        if not isinstance(man.get(key), typ):
            probs.append(Problem(MANIFEST, "schema",
                                 f"{_show(path)}: field {key!r} missing or not a {typ.__name__}"))
    if probs:
        return None, probs
    seen = set()
    for i, ent in enumerate(man["cases"]):
        bad = [k for k, t in _CASE_FIELDS.items()
               if not isinstance(ent, dict) or not isinstance(ent.get(k), t)]
        if bad:
            probs.append(Problem(MANIFEST, "schema", f"{_show(path)}: cases[{i}] lacks a valid "
                                                     f"{', '.join(bad)}"))
            continue
        if ent["id"] in seen:
            probs.append(Problem(MANIFEST, "schema",
                                 f"{_show(path)}: case {ent['id']} listed twice"))
        seen.add(ent["id"])
        if Path(ent["file"]).name != ent["file"]:
            probs.append(Problem(MANIFEST, "schema",
                                 f"{_show(path)}: cases[{i}] file {ent['file']!r} is not a plain "
                                 f"file name"))
            continue
        try:
            case = Case(**ent["params"])
        except (TypeError, ValueError) as exc:
            probs.append(Problem(MANIFEST, "schema", f"{_show(path)}: case {ent['id']}: bad "
                                                     f"parameters ({exc})"))
            continue
        if case.id != ent["id"]:
            probs.append(Problem(MANIFEST, "schema",
                                 f"{_show(path)}: case {ent['id']}: its parameters now give the "
                                 f"id {case.id} (case ids changed; regenerate)"))
    if probs:
        return None, probs
    return man, []


def _check_blob(root: Path, ent: dict) -> tuple[bytes | None, Problem | None]:
    """The file's bytes if they match the manifest's size and sha256."""
    name = ent["file"]
    path = root / name
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None, Problem(name, "missing", f"{_show(path)}: missing (case {ent['id']})")
    except OSError as exc:
        return None, Problem(name, "unreadable", f"{_show(path)}: unreadable ({exc.strerror})")
    if len(blob) < ent["bytes"]:
        return None, Problem(name, "truncated", f"{_show(path)}: truncated ({len(blob)} of "
                                                f"{ent['bytes']} bytes)")
    if len(blob) > ent["bytes"]:
        return None, Problem(name, "corrupted", f"{_show(path)}: {len(blob)} bytes, the manifest "
                                                f"says {ent['bytes']} (corrupted)")
    if sha256(blob) != ent["sha256"]:
        return None, Problem(name, "corrupted", f"{_show(path)}: sha256 mismatch (corrupted: "
                                                f"the bytes differ from those recorded)")
    return blob, None


def _parse_blob(name: str, blob: bytes, ent: dict) -> tuple[np.ndarray, float | None]:
    """ref and torch_err out of .npz bytes; GoldenError if the content is not as recorded."""
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            if sorted(z.files) != sorted(_ARRAYS):
                raise GoldenError(f"{name}: holds {sorted(z.files)}, expected {list(_ARRAYS)}")
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


def _expected_shape(case: Case) -> list[int]:
    return [case.batch, case.q_len, case.n_heads, case.head_dim]


@dataclasses.dataclass
class VerifyResult:
    root: Path
    n_cases: int
    problems: list[Problem]
    notes: list[str]
    manifest: dict | None

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        m = self.manifest or {}
        return {"schema": "sdpa_probe.golden-verify/1", "dir": str(self.root), "ok": self.ok,
                "cases": self.n_cases, "versions": m.get("versions"),
                "problems": [p.as_dict() for p in self.problems], "notes": self.notes}


def verify(root: Path, check_inputs: bool = True,
           progress: Callable[[str], None] | None = None) -> VerifyResult:
    """Schema, sizes, hashes and contents of every file; optionally the inputs
    regenerated from each seed against their recorded sha256."""
    man, probs = read_manifest(root)
    if man is None:
        return VerifyResult(root, 0, probs, [], None)
    notes = []
    now = versions()
    for k, v in man["versions"].items():
        if now.get(k) != v:
            notes.append(f"made with {k} {v}; this environment has {now.get(k)}")
    live = semantics()
    for k, v in man["semantics"].items():
        if live.get(k) != v:
            probs.append(Problem(MANIFEST, "semantics",
                                 f"{_show(root / MANIFEST)}: the data encodes {k} = {v!r}; this "
                                 f"sdpa_probe's oracle gives {live.get(k)!r}"))
    for ent in man["cases"]:
        if progress:
            progress(ent["id"])
        case = Case(**ent["params"])
        if ent["shape"] != _expected_shape(case):
            probs.append(Problem(ent["file"], "schema", f"{ent['file']}: shape {ent['shape']} "
                                                        f"does not fit the case parameters"))
            continue
        blob, prob = _check_blob(root, ent)
        if prob:
            probs.append(prob)
            continue
        try:
            _parse_blob(_show(root / ent["file"]), blob, ent)
        except GoldenError as exc:
            probs.append(Problem(ent["file"], "unreadable", str(exc)))
            continue
        if check_inputs:
            from .inputs import materialise

            if inputs_digest(materialise(case)) != ent["inputs_sha256"]:
                probs.append(Problem(ent["file"], "inputs", _inputs_msg(ent, man)))
    listed = {e["file"] for e in man["cases"]}
    for p in sorted(root.glob("*.npz")):
        if p.name not in listed:
            notes.append(f"{_show(p)} is not in the manifest (ignored)")
    return VerifyResult(root, len(man["cases"]), probs, notes, man)


def _inputs_msg(ent: dict, man: dict) -> str:
    return (f"{ent['file']}: the inputs regenerated from seed {ent['seed']} differ from those "
            f"the reference was computed from (numpy {np.__version__} now, "
            f"{man['versions'].get('numpy')} at generation); regenerate and review")


class GoldenStore:
    """A golden directory opened for reading references (the `--golden` check path)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        man, probs = read_manifest(self.root)
        if man is None:
            raise GoldenError(f"{probs[0].message} (see probe golden verify)")
        self.manifest = man
        self.entries = {e["id"]: e for e in man["cases"]}

    def missing(self, cases: Iterable[Case]) -> list[str]:
        """Cases judged against a reference that the set does not hold."""
        return [c.id for c in cases if c.needs_reference and c.id not in self.entries]

    def require(self, cases: list[Case]) -> None:
        """Every case stored, every file intact: else one GoldenError naming the first."""
        miss = self.missing(cases)
        if miss:
            more = f" and {len(miss) - 3} more" if len(miss) > 3 else ""
            raise GoldenError(f"{len(miss)} selected case(s) are not in the golden set "
                              f"{_show(self.root)}: {', '.join(miss[:3])}{more}; select stored "
                              f"cases with -k, or add them with probe golden regen --cases ID")
        for c in (c for c in cases if c.needs_reference):
            _, prob = _check_blob(self.root, self.entries[c.id])
            if prob:
                raise GoldenError(f"{prob.message} (see probe golden verify)")

    def reference(self, case: Case, data=None) -> tuple[np.ndarray, float | None]:
        """(ref, torch_err) for a case; with its materialised inputs, also proves they
        are the inputs the reference was made from."""
        ent = self.entries.get(case.id)
        if ent is None:
            raise GoldenError(f"case {case.id} is not in the golden set {_show(self.root)}")
        blob, prob = _check_blob(self.root, ent)
        if prob:
            raise GoldenError(prob.message)
        ref, terr = _parse_blob(_show(self.root / ent["file"]), blob, ent)
        if data is not None and inputs_digest(data) != ent["inputs_sha256"]:
            raise GoldenError(_inputs_msg(ent, self.manifest))
        return ref, terr


_stores: dict[str, tuple[tuple, GoldenStore]] = {}


def store(root: Path | str) -> GoldenStore:
    """A GoldenStore per directory, read again only when its manifest changes."""
    key = str(Path(root).resolve())
    try:
        st = (Path(root) / MANIFEST).stat()
        stamp: tuple = (st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:
        stamp = ()
    hit = _stores.get(key)
    if hit is None or hit[0] != stamp or not stamp:
        _stores[key] = (stamp, GoldenStore(Path(root)))
    return _stores[key][1]


# ---- comparing ---------------------------------------------------------------------

def _g(x: float | None) -> str:
    return "none" if x is None else f"{x:.3g}"


def _at(idx) -> str:
    b, i, h, d = idx
    return f"b={b} q={i} h={h} d={d}"


def compare(case: Case, old_ref: np.ndarray, old_terr: float | None, old_inputs: str,
            new_ref: np.ndarray, new_terr: float | None, new_inputs: str,
            drift: float = DRIFT_FRACTION, torch_comparable: bool = True) -> dict:
    """How a case's golden data moved from old to new. status: same (no element moved),
    within (moved less than `drift` x tolerance), changed (more, or NaN/Inf pattern,
    shape, inputs or a verdict-relevant torch_err changed). torch_comparable=False (the
    two torch_err were measured under different torch CPU capabilities): a torch_err move
    is a note, not a change."""
    atol, rtol = tolerance(case)
    row = {"case": case.id, "status": "same", "max_abs_delta": 0.0, "tol_fraction": 0.0,
           "where": None, "nonfinite_rows": 0, "torch_err_old": old_terr,
           "torch_err_new": new_terr, "reasons": [], "notes": []}
    reasons = row["reasons"]
    if old_inputs != new_inputs:
        reasons.append("inputs differ (the seed now generates other inputs)")
    if old_ref.shape != new_ref.shape:
        reasons.append(f"shape {list(old_ref.shape)} -> {list(new_ref.shape)}")
        row["status"] = "changed"
        return row
    of, nf = np.isfinite(old_ref), np.isfinite(new_ref)
    pattern = of != nf
    if pattern.any():
        rows = pattern.any(axis=-1)
        n = int(rows.sum())
        row["nonfinite_rows"] = n
        first = tuple(int(x) for x in np.argwhere(rows)[0])
        if (~nf[pattern]).all():
            zero = int(((old_ref == 0).all(axis=-1) & rows).sum())
            msg = f"NaN/Inf in {n} rows where the old reference is finite"
            if zero:
                msg += f" ({zero} of them zeros in the old: fully masked rows)"
        elif (~of[pattern]).all():
            zero = int(((new_ref == 0).all(axis=-1) & rows).sum())
            msg = f"finite in {n} rows where the old reference is NaN/Inf"
            if zero:
                msg += f" ({zero} of them zeros in the new: fully masked rows)"
        else:
            msg = f"NaN/Inf pattern differs in {n} rows"
        reasons.append(f"{msg}; first at b={first[0]} q={first[1]} h={first[2]}")
    both = of & nf
    delta = np.where(both, np.abs(new_ref - old_ref), 0.0)
    bound = atol + rtol * np.abs(np.where(of, old_ref, 0.0))
    frac = delta / bound
    if delta.size:
        idx = tuple(int(x) for x in np.unravel_index(int(np.argmax(frac)), frac.shape))
        row.update(max_abs_delta=float(delta.max()), tol_fraction=float(frac[idx]))
        if frac[idx] > 0:
            row["where"] = list(idx)
        if frac[idx] > drift:
            n_bad = int((frac > drift).sum())
            reasons.append(f"{n_bad} elements moved by more than {drift:g} x tolerance: worst "
                           f"|delta| {delta[idx]:.3g} = {frac[idx]:.3g} x tolerance at "
                           f"{_at(idx)} (old {old_ref[idx]:.9g}, new {new_ref[idx]:.9g})")
    a0, a1 = judged_tolerance(case, old_terr)[0], judged_tolerance(case, new_terr)[0]
    if abs(a1 - a0) > TORCH_ERR_DRIFT * a0:
        msg = (f"torch_err {_g(old_terr)} -> {_g(new_terr)} moves this case's atol "
               f"{a0:.3g} -> {a1:.3g}")
        if torch_comparable:
            reasons.append(msg)
        else:
            row["notes"].append(msg + " (torch_err measured under another torch CPU capability)")
    if reasons:
        row["status"] = "changed"
    elif (delta > 0).any() or old_terr != new_terr:
        row["status"] = "within"
    return row


# ---- regenerating ------------------------------------------------------------------

def reference_suite(name: str) -> list[Case]:
    """A suite's cases that have a reference (not its invalid-argument calls)."""
    return [c for c in suite(name) if c.needs_reference]


def select_cases(specs: list[str] | None, suite_name: str) -> list[Case]:
    """--cases: ids, or substrings of ids, from the full matrix (repeatable, comma
    separated); none: the whole suite."""
    if not specs:
        try:
            return reference_suite(suite_name)
        except KeyError:
            raise ProbeError(f"unknown suite {suite_name!r}; known: smoke, default, full") \
                from None
    every = all_cases()
    chosen: dict[str, Case] = {}
    for spec in specs:
        for s in (x.strip() for x in spec.split(",")):
            if not s:
                continue
            hits = [every[s]] if s in every else [c for i, c in every.items() if s in i]
            if not hits:
                raise ProbeError(f"no case id matches {s!r} (ids: probe check --list --suite "
                                 f"full)")
            hits = [c for c in hits if c.needs_reference]
            if not hits:
                raise ProbeError(f"{s!r} matches only invalid-argument cases, which are "
                                 "judged on their status and have no reference")
            for c in hits:
                chosen[c.id] = c
    if not chosen:
        raise ProbeError("--cases is empty: give case ids (or parts of ids), comma separated")
    return list(chosen.values())


@dataclasses.dataclass
class RegenPlan:
    root: Path
    entries: list[Entry]            # every case the new manifest lists
    rows: list[dict]                # per regenerated case: status new/same/within/changed
    removed: list[str]              # ids the new manifest drops
    blocking: list[str]             # why writing needs --accept
    old_manifest: dict | None
    new_manifest: dict
    written: bool = False

    def as_dict(self) -> dict:
        counts: dict = {}
        for r in self.rows:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        return {"schema": "sdpa_probe.golden-regen/1", "dir": str(self.root),
                "written": self.written, "cases": len(self.entries), "counts": counts,
                "removed": self.removed, "blocking": self.blocking,
                "versions": self.new_manifest["versions"],
                "old_versions": (self.old_manifest or {}).get("versions"), "rows": self.rows}


def plan_regen(root: Path, cases: list[Case], *, prune: bool, suite_name: str | None,
               drift: float = DRIFT_FRACTION,
               progress: Callable[[Case], None] | None = None) -> RegenPlan:
    """Regenerate `cases` in memory and compare with what `root` holds. With prune,
    the new set is exactly `cases`; without, the other stored cases are kept as they
    are (their files are verified first)."""
    import torch

    old_man, old_probs = read_manifest(root)
    blocking: list[str] = []
    old_entries: dict[str, dict] = {}
    if old_man is not None:
        old_entries = {e["id"]: e for e in old_man["cases"]}
        live = semantics()
        for k, v in old_man["semantics"].items():
            if live.get(k) != v:
                blocking.append(f"semantics: {k} was {v!r}, the oracle now gives "
                                f"{live.get(k)!r}")
    elif old_probs and old_probs[0].kind != "missing":
        blocking.append(f"the existing manifest cannot be read, so nothing can be compared: "
                        f"{old_probs[0].message}")

    kept = set(old_entries) - {c.id for c in cases} if not prune else set()
    now = {"versions": versions()}
    comparable = torch_err_comparable(old_man, now)
    if kept and not comparable:
        # the manifest has one set of versions: stored torch_err values made under
        # another ISA / CPU beside fresh ones would be read as this machine's
        was = old_man.get("versions") or {}
        raise GoldenError(
            f"the {len(kept)} stored case(s) this regen would keep were made under torch_cpu "
            f"{was.get('torch_cpu')} on {was.get('cpu')!r}, this machine is "
            f"{now['versions']['torch_cpu']} on {now['versions']['cpu']!r}: regenerate every "
            f"stored case here (the suite, or --cases naming them all) or add the cases on "
            f"such a machine")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one reduction order: the same bytes on every rerun
    try:
        fresh = []
        for c in cases:
            if progress:
                progress(c)
            fresh.append(generate(c))
    finally:
        torch.set_num_threads(threads)

    rows = []
    for e in fresh:
        ent = old_entries.get(e.case.id)
        if ent is None:
            rows.append({"case": e.case.id, "status": "new", "reasons": []})
            path = root / e.file
            if path.exists() and (not path.is_file() or path.read_bytes() != e.to_bytes()):
                blocking.append(f"{_show(path)} exists but no manifest describes it; it would "
                                f"be overwritten")
            continue
        blob, prob = _check_blob(root, ent)
        if prob is None:
            try:
                old_ref, old_terr = _parse_blob(ent["file"], blob, ent)
            except GoldenError as exc:
                prob = Problem(ent["file"], "unreadable", str(exc))
        if prob is not None:
            row = {"case": e.case.id, "status": "changed",
                   "reasons": [f"the stored file cannot be compared: {prob.message}"]}
        else:
            row = compare(e.case, old_ref, old_terr, ent["inputs_sha256"], e.ref,
                          e.torch_err, e.inputs_sha256, drift, comparable)
        rows.append(row)
        if row["status"] == "changed":
            blocking.append(f"{e.case.id}: " + "; ".join(row["reasons"]))

    new_ids = {e.case.id for e in fresh}
    entries = list(fresh)
    removed: list[str] = []
    for cid, ent in sorted(old_entries.items()):
        if cid in new_ids:
            continue
        if prune:
            removed.append(cid)
            continue
        # kept as stored: it must still be intact and readable
        blob, prob = _check_blob(root, ent)
        if prob:
            raise GoldenError(f"cannot keep {cid}: {prob.message}; regenerate it too "
                              f"(--cases {cid}) or run a full regen")
        ref, terr = _parse_blob(ent["file"], blob, ent)
        entries.append(Entry(Case(**ent["params"]), ref, terr, ent["inputs_sha256"], blob))
    if removed:
        blocking.append(f"{len(removed)} stored case(s) are not in the new set and would be "
                        f"removed: {', '.join(removed[:5])}" + (" ..." if len(removed) > 5 else ""))
    if not prune and old_man is not None:
        suite_name = old_man.get("suite")
    ids = {e.case.id for e in entries}
    if suite_name not in SUITES or ids != {c.id for c in reference_suite(suite_name)}:
        suite_name = None  # not exactly a suite: the manifest's case list says what it is
    new_man = build_manifest(entries, suite_name)
    return RegenPlan(root, entries, rows, removed, blocking, old_man, new_man)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_plan(plan: RegenPlan) -> None:
    """Write changed files first and the manifest last; remove dropped cases' files.
    Files whose bytes are unchanged are not touched."""
    root = plan.root
    try:
        root.mkdir(parents=True, exist_ok=True)
        for e in plan.entries:
            path = root / e.file
            blob = e.to_bytes()
            if path.is_file() and path.read_bytes() == blob:
                continue
            _write_atomic(path, blob)
        man = manifest_bytes(plan.new_manifest)
        mpath = root / MANIFEST
        if not (mpath.is_file() and mpath.read_bytes() == man):
            _write_atomic(mpath, man)
        old = {e["id"]: e["file"] for e in (plan.old_manifest or {}).get("cases", [])}
        keep = {e.file for e in plan.entries}
        for cid in plan.removed:
            f = old.get(cid)
            if f and f not in keep:
                (root / f).unlink(missing_ok=True)
    except OSError as exc:
        raise ProbeError(f"cannot write the golden data in {_show(root)}: "
                         f"{exc.strerror or exc}") from None
    plan.written = True


# ---- diffing two sets ----------------------------------------------------------------

def diff_sets(a: Path, b: Path, drift: float = DRIFT_FRACTION) -> dict:
    """Case by case, how set b differs from set a (a = this, b = other)."""
    man_a, pa = read_manifest(a)
    man_b, pb = read_manifest(b)
    if man_a is None:
        raise GoldenError(pa[0].message)
    if man_b is None:
        raise GoldenError(pb[0].message)
    ea = {e["id"]: e for e in man_a["cases"]}
    eb = {e["id"]: e for e in man_b["cases"]}
    rows = []
    for cid in sorted(set(ea) | set(eb)):
        if cid not in eb:
            rows.append({"case": cid, "status": "only-this", "reasons": []})
            continue
        if cid not in ea:
            rows.append({"case": cid, "status": "only-other", "reasons": []})
            continue
        loaded = []
        for root, ent in ((a, ea[cid]), (b, eb[cid])):
            blob, prob = _check_blob(root, ent)
            if prob is None:
                try:
                    loaded.append(_parse_blob(_show(root / ent["file"]), blob, ent))
                except GoldenError as exc:
                    prob = Problem(ent["file"], "unreadable", str(exc))
            if prob is not None:
                rows.append({"case": cid, "status": "unreadable", "reasons": [prob.message]})
                break
        if len(loaded) < 2:
            continue
        (ra, ta), (rb, tb) = loaded
        case = Case(**ea[cid]["params"])
        rows.append(compare(case, ra, ta, ea[cid]["inputs_sha256"], rb, tb,
                            eb[cid]["inputs_sha256"], drift, torch_err_comparable(man_a, man_b)))
    header = {}
    for key in ("versions", "semantics", "generator"):
        va, vb = man_a.get(key, {}), man_b.get(key, {})
        header[key] = {k: {"this": va.get(k), "other": vb.get(k)}
                       for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)}
    counts: dict = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    differs = any(r["status"] not in ("same", "within") for r in rows) or bool(header["semantics"])
    return {"schema": "sdpa_probe.golden-diff/1", "this": str(a), "other": str(b),
            "drift_fraction": drift, "differs": differs, "counts": counts, **header,
            "rows": rows}
