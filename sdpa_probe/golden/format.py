"""The bytes of golden data: where a golden directory is, deterministic .npz files,
the manifest's JSON, and the sha256 digests of files, of a case's inputs and of its
whole stored record."""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import ProbeError
from ..native import QuantTensor

SCHEMA = "sdpa_probe.golden/2"
SCHEMA_VERSION = 2
# version 1 has no header_sha256 / record_sha256: read (regen compares against it),
# never trusted (verify and check --golden ask for a regen)
UNHASHED = ("sdpa_probe.golden/1", 1)
GENERATOR = {"name": "sdpa_probe.golden", "version": __version__, "format": 1}
MANIFEST = "manifest.json"
DEFAULT_SUITE = "default"
ARRAYS = ("ref", "torch_err")  # the members of every case's .npz
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


class GoldenError(ProbeError):
    """The golden data cannot be used (missing, corrupted, or lacks a case)."""


def default_dir() -> Path:
    """$SDPA_PROBE_GOLDEN, else the checkout's golden/, else ./golden."""
    env = os.environ.get("SDPA_PROBE_GOLDEN")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2] / "golden"
    if repo.is_dir():
        return repo
    return Path("golden")


def show_path(path: Path) -> str:
    """A path as messages name it: relative to the working directory when under it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


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


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1, allow_nan=False) + "\n").encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def inputs_digest(data) -> str:
    """sha256 over everything a kernel and the oracle get: real q/k/v values, the mask,
    and the storage arrays (int8 data, scales and zero points included)."""
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


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def header_digest(manifest: dict) -> str:
    """sha256 of every top-level field but the case list and the digest itself: schema,
    generator, versions, semantics, suite."""
    return sha256(_canonical({k: v for k, v in manifest.items()
                              if k not in ("cases", "header_sha256")}))


def arrays_digest(ref: np.ndarray, torch_err: float | None) -> str:
    """sha256 over the stored arrays' dtypes, shapes and values (NaN torch_err: none)."""
    h = hashlib.sha256()
    terr = np.float64(np.nan if torch_err is None else torch_err)
    for name, a in (("ref", np.ascontiguousarray(ref)), ("torch_err", np.asarray(terr))):
        h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def record_digest(entry: dict, header_sha256: str, ref: np.ndarray,
                  torch_err: float | None) -> str:
    """sha256 of a case's whole stored record: every field of its manifest entry (but
    this digest), the manifest's header digest, and its arrays."""
    fields = {k: v for k, v in entry.items() if k != "record_sha256"}
    return sha256(_canonical({"entry": fields, "header_sha256": header_sha256,
                              "arrays": arrays_digest(ref, torch_err)}))


def summary(ref: np.ndarray, torch_err: float | None) -> dict:
    """The manifest fields read off a case's arrays (for reading a diff of the manifest)."""
    rows = ref.reshape(-1, ref.shape[-1]) if ref.size else ref.reshape(0, 1)
    finite = np.isfinite(ref)
    return {"shape": list(ref.shape), "torch_err": torch_err,
            "zero_rows": int((rows == 0).all(axis=-1).sum()),
            "nonfinite": int((~finite).sum()),
            "max_abs": float(np.abs(ref[finite]).max()) if finite.any() else 0.0}


def seal(manifest: dict, arrays: dict[str, tuple[np.ndarray, float | None]]) -> dict:
    """The manifest with its header digest and every case's record digest set; arrays:
    case id -> (ref, torch_err)."""
    manifest["header_sha256"] = header_digest(manifest)
    for ent in manifest["cases"]:
        ref, terr = arrays[ent["id"]]
        ent["record_sha256"] = record_digest(ent, manifest["header_sha256"], ref, terr)
    return manifest
