"""Where reports are written: a JSON document or text to a path (or stdout for '-'),
and the guard that checks an output path before the work, so that a run never ends
by overwriting a user's file. Below every other module of the package: it imports
none of them but the error type and the tool's name."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import TOOL
from .errors import ProbeError


def _clean(obj: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings so the file stays valid JSON. An
    object with as_dict() (a check record) is written as that."""
    if hasattr(obj, "as_dict"):
        return _clean(obj.as_dict())
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(_clean(obj), indent=2, allow_nan=False)


def write_text(path: str, text: str, force: bool = False) -> None:
    """Write text to a path, or to stdout for '-'; an OS error is a one-line ProbeError.
    The path is checked again (a file of the user's may have appeared there during the
    run), written to a temporary file beside it and renamed over it: never through a
    symbolic link, never half a report."""
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    p = Path(path).expanduser()
    why = _refusal(p, (), force)
    if why is not None:
        raise ProbeError(f"cannot write {path}: {why} (it changed during the run; the report "
                         "was not written)")
    try:
        with tempfile.NamedTemporaryFile("w", dir=p.parent, prefix=f".{p.name}.",
                                         delete=False) as fh:
            fh.write(text)
        os.chmod(fh.name, 0o666 & ~_umask())
        os.replace(fh.name, p)
    except OSError as exc:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(fh.name)
        raise ProbeError(f"cannot write {path}: {exc.strerror}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str, obj: Any) -> None:
    """Write a JSON document to a path, or to stdout for '-'."""
    write_text(path, dumps(obj) + "\n")


def check_writable(path: str | None, option: str, inputs=(), stdout_ok: bool = True,
                   force: bool = False) -> None:
    """Before the work, not after it: an output PATH must be a new file, an empty one
    or a report this tool wrote earlier (rerunning a command overwrites its own
    output), in an existing, writable directory, and none of the command's input files
    (a --kernel source); otherwise a one-line ProbeError naming the option. force: any
    regular file may be replaced (--output --force), never an input or a link."""
    if path is None:
        return
    if path == "-":
        if not stdout_ok:
            raise ProbeError(f"cannot write {option} to stdout ('-'): give it a file")
        return
    why = _refusal(Path(path).expanduser(), inputs, force)
    if why is not None:
        raise ProbeError(f"cannot write {option} {path}: {why}")


def _refusal(p: Path, inputs, force: bool = False) -> str | None:
    """Why a report may not be written at p, or None."""
    parent = p.parent
    if p.is_symlink():
        why = "it is a symbolic link (probe does not write through one)"
    elif any(p.exists() and Path(i).expanduser().exists() and p.samefile(Path(i).expanduser())
             for i in inputs if i):
        why = "it is an input of this command (a kernel file); refusing to overwrite it"
    elif _in_golden_set(p):
        why = "it is in a golden data directory (probe golden regen writes those)"
    elif p.is_dir():
        why = "it is a directory"
    elif not parent.is_dir():
        why = f"{parent} is not a directory" if parent.exists() else f"no directory {parent}"
    elif not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        why = "permission denied"
    elif not force and (foreign := _not_a_report(p)) is not None:
        why = f"{foreign}; refusing to overwrite it (remove it, or choose another path)"
    else:
        why = _open_fails(p)
    return why


def _in_golden_set(p: Path) -> bool:
    """Whether p is (or would be) a file of a golden data set: its folder holds a
    manifest of schema sdpa_probe.golden/*."""
    try:
        doc = json.loads((p.parent / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str(doc.get("schema", "")).startswith("sdpa_probe.golden")


# written before reports said who wrote them (TOOL): probe bench's, probe profile's and
# its interactive session's
_OLD_BENCH_KEYS = {"schema", "mode", "peers", "results"}
_OLD_PROFILE_KEYS = {"model", "weights", "cache", "builds", "steps"}
# the header row of probe profile --csv up to its machine columns: what
# sdpa_probe.profile.report.CSV_FIELDS names (tests/test_profile_files.py checks they agree)
PROFILE_CSV_HEAD = ("attention,kernel,context,op,kind,calls,median_ms,iqr_ms,mean_ms,share,"
                    "bytes,flops,gb_s,gflop_s,roofline_pct,allocs_per_step,"
                    "alloc_bytes_per_step,step_median_ms,step_iqr_ms,")
_SNIFF_LIMIT = 1 << 30  # (a report is far smaller; a larger file is not one)
_NOT_A_REPORT = "it exists and is not one of probe's reports"


def _is_report(doc: Any) -> bool:
    """A JSON document this tool writes: check, bench, profile, an interactive profile
    session, a Chrome trace of a profile, a reproduction."""
    if not isinstance(doc, dict):
        return False
    tool, schema = doc.get("tool"), doc.get("schema")
    meta = doc.get("otherData")
    return ((isinstance(tool, dict) and tool.get("name") == TOOL["name"])
            or (isinstance(schema, str) and schema.startswith("sdpa_probe."))
            or (schema == 1 and _OLD_BENCH_KEYS <= doc.keys())
            or _OLD_PROFILE_KEYS <= doc.keys()
            or (doc.get("interactive") is True and isinstance(doc.get("runs"), list))
            or ("traceEvents" in doc and isinstance(meta, dict) and TOOL["name"] in meta))


def _not_a_report(p: Path) -> str | None:
    """Why an existing file at an output path is the user's, not an earlier report of
    this tool's (None: it is one, it is empty, or it is no regular file). A mistyped
    --json README.md is refused before the work instead of being lost after it."""
    if not p.is_file():
        return None  # new, or a FIFO or a device (/dev/stdout)
    try:
        size = p.stat().st_size
        if size == 0:
            return None
        if size > _SNIFF_LIMIT:
            return _NOT_A_REPORT
        text = p.read_bytes().decode("utf-8", "replace")
    except OSError as exc:
        return f"it exists and cannot be read ({exc.strerror})"
    head = text[:4096].lstrip()
    if head.startswith('{"probe": '):  # --format jsonl: each line names the command
        ours = True
    elif head.startswith("{"):
        try:
            ours = _is_report(json.loads(text))
        except ValueError:
            ours = False
    elif head.startswith("<?xml") or head.startswith("<testsuites"):
        ours = '<testsuites name="probe check"' in head  # JUnit XML of probe check
    elif head.startswith("<svg"):
        ours = "<title>probe profile" in head  # probe profile --chart
    elif head.startswith("#"):  # the conformance report (conformance.TITLE), --format md,
        ours = head.startswith("# probe ")  # a table written by --output
    elif head.startswith("probe,"):  # --format csv: its first column names the command
        ours = True
    else:  # probe profile --csv: its header row
        ours = head.startswith(PROFILE_CSV_HEAD)
    return None if ours else _NOT_A_REPORT


def _open_fails(p: Path) -> str | None:
    """Open the path for appending, which truncates nothing, and remove it again if
    this made it: os.access says yes to root on a read-only file system, /proc or
    /sys, where the write at the end of a long run would then fail."""
    existed = p.exists()
    if existed and not p.is_file():
        return None  # a FIFO or a device (/dev/stdout): opening one could block
    try:
        with open(p, "a"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    if not existed:
        try:
            p.unlink()
        except OSError:
            pass
    return None
