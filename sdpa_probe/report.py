"""Check reports: the JSON record (schema in docs/check.md) and JUnit XML."""

from __future__ import annotations

import collections
import platform
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from . import TOOL
from .build import cpu_model
from .errors import ProbeError
from .outputs import write_text
from .records import FAILING, STATUSES, Record, diagnosis_lines

SCHEMA = "sdpa_probe.check/1"


def summary(records: list[Record]) -> dict:
    counts = collections.Counter(r.status for r in records)
    return {s: counts.get(s, 0) for s in STATUSES} | {"total": len(records)}


def by_backend_family(records: list[Record]) -> dict:
    table: dict = collections.defaultdict(lambda: collections.Counter())
    for r in records:
        table[(r.backend, r.family)][r.status] += 1
    return table


def check_document(records: list[Record], *, suite: str, seconds: float, backends: list[str],
                   seed: int, run: dict | None = None) -> dict:
    """The `--json` document; `run`: how the cases were run (isolation, leak check,
    heap guard), so that two documents' verdicts can be told apart by it."""
    import torch  # deferred: the versions of what ran; probe --help imports no torch

    clean = [r.as_dict() for r in records]
    return {
        "schema": SCHEMA,
        "tool": dict(TOOL),
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "numpy": np.__version__, "machine": platform.machine(),
                        "cpu": cpu_model()},
        "suite": suite,
        "seed": seed,
        "run": run or {},
        "backends": backends,
        "seconds": seconds,
        "records": clean,
        "summary": summary(records),
    }


def exit_code(records: list[Record]) -> int:
    return 1 if any(r.status in FAILING for r in records) else 0


def write_junit(path: str, records: list[Record], seconds: float) -> None:
    root = ET.Element("testsuites", name="probe check", time=f"{seconds:.3f}")
    groups: dict = collections.defaultdict(list)
    for r in records:
        groups[r.backend].append(r)
    for backend, recs in groups.items():
        s = summary(recs)
        suite = ET.SubElement(root, "testsuite", name=backend, tests=str(len(recs)),
                              failures=str(s["fail"]), errors=str(s["crash"] + s["timeout"] +
                                                                  s["error"]),
                              skipped=str(s["unsupported"]))
        for r in recs:
            tc = ET.SubElement(suite, "testcase", classname=f"{backend}.{r['family']}",
                               name=r.case, time=f"{r['seconds'] or 0.0:.6f}")
            st = r.status
            # (the body: the case in words, the diagnosis, then the command that reruns it)
            body = "\n".join([f"case: {r.case_in_words}"] * bool(r.case_in_words)
                              + [f"diagnosis: {x}" for x in diagnosis_lines(r.diagnosis)]
                              + [r.repro])
            if st == "fail":
                ET.SubElement(tc, "failure", message=r.reason, type="fail").text = body
            elif st in ("crash", "timeout", "error"):
                ET.SubElement(tc, "error", message=r.reason, type=st).text = body
            elif st == "unsupported":
                ET.SubElement(tc, "skipped", message=r.reason)
    tree = ET.ElementTree(root)
    ET.indent(tree)
    write_text(path, ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")


def save_repro(directory: Path, case, data, ref, backend: str) -> list[Path]:
    """Write the case's inputs and reference (.npz) and a torch-only Python snippet."""
    npz = directory / f"{case.id}.npz"
    arrays = {"q": data.q.numpy(), "k": data.k.numpy(), "v": data.v.numpy(), "reference": ref}
    if data.mask is not None:
        arrays["mask"] = data.mask
    script = directory / f"{case.id}.py"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(npz, **arrays)
        script.write_text(_SNIPPET.format(case_id=case.id, backend=backend, npz=npz.name,
                                          causal=case.causal, start_pos=case.start_pos,
                                          scale=case.scale, dtype=case.dtype,
                                          params=repr(case.params())))
    except OSError as exc:
        raise ProbeError(f"cannot write the reproduction into {directory}: "
                         f"{exc.strerror}") from None
    return [npz, script]


_SNIPPET = '''"""Reproduce sdpa_probe case {case_id} (failing on {backend}) with torch alone.

Case parameters: {params}
q, k, v hold the stored input values (after {dtype} rounding / int8 dequantisation)
as float64 in the layout [batch, seq, heads, head_dim]; `reference` is the float64
oracle output. Causal alignment is bottom-right: query row i sits at position
start_pos + i and sees keys j <= start_pos + i.
"""
import math
from pathlib import Path

import numpy as np
import torch

d = np.load(Path(__file__).with_name("{npz}"))
q, k, v = (torch.from_numpy(d[n]) for n in ("q", "k", "v"))
mask = torch.from_numpy(d["mask"]).double() if "mask" in d else None
causal, start_pos, scale = {causal}, {start_pos}, {scale}

B, Lq, H, D = q.shape
Lkv, Hkv = k.shape[1], k.shape[2]
bias = torch.zeros(Lq, Lkv, dtype=torch.float64)
if mask is not None:
    bias = bias + mask
if causal:
    i = torch.arange(Lq)[:, None]
    j = torch.arange(Lkv)[None, :]
    bias = bias.masked_fill(j > start_pos + i, -math.inf)
g = torch.arange(H) // (H // Hkv)                      # GQA: query head h reads kv head g[h]
s = torch.einsum("bihd,bjhd->bhij", q, k[:, :, g]) * (scale if scale > 0 else D ** -0.5) + bias
m = s.amax(-1, keepdim=True)
p = torch.exp(s - torch.where(torch.isneginf(m), 0.0, m))
out = torch.einsum("bhij,bjhd->bihd", p, v[:, :, g]) / p.sum(-1).clamp_min(1e-300)[..., None] \\
    .permute(0, 2, 1, 3)
out = torch.where(torch.isneginf(m).permute(0, 2, 1, 3), 0.0, out)  # no visible key: zeros
print("max |oracle - stored reference|:", (out - torch.from_numpy(d["reference"])).abs().max())
# Compare your kernel's output against `out` here.
'''
