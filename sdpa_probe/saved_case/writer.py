"""A failing case written to a directory for a C driver: each tensor's raw elements as
the kernel read them (dtype, strides and offset kept; the far layout's batches, 2^31
elements apart, packed), the float64 reference, case.h, driver.c, the ABI header and a
Makefile that builds them against your kernel with ASan and UBSan."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np

from ..build import INCLUDE_DIR
from ..cases import Case, case_in_words
from ..errors import ProbeError
from ..inputs import OUT_NP, POISON, out_buffer
from ..native import QuantTensor
from .driver_source import DRIVER_C, MAKEFILE

DTYPE_CODE = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.uint16): 2,
              np.dtype(np.int8): 3}
# a tensor whose elements span more than this many times their count (the far layout)
# is written packed: its gaps would be gigabytes of nothing
MAX_SPAN_RATIO = 64


@dataclasses.dataclass
class Span:
    """A view's elements as one run of memory: `raw` from its lowest to its highest
    element, the first element `offset` elements in, `strides` in elements."""

    raw: bytes
    n: int
    offset: int
    strides: list[int]
    packed: bool = False


def span(a: np.ndarray) -> Span:
    item = a.itemsize
    if a.size == 0:  # (an empty cache: nothing to read, its dtype still given)
        return Span(b"", 0, 0, [s // item for s in a.strides])
    lo = hi = a.__array_interface__["data"][0]
    for dim, st in zip(a.shape, a.strides, strict=True):
        reach = (dim - 1) * st
        lo, hi = (lo + reach, hi) if st < 0 else (lo, hi + reach)
    n = (hi - lo) // item + 1
    if n > MAX_SPAN_RATIO * max(a.size, 1) + 4096:
        c = np.ascontiguousarray(a)
        return Span(c.tobytes(), c.size, 0, [s // item for s in c.strides], packed=True)
    first = (a.__array_interface__["data"][0] - lo) // item
    return Span(ctypes.string_at(lo, n * item), n, first, [s // item for s in a.strides])


def _c_tensor(name: str, store, files: dict[str, bytes]) -> str:
    """The saved_tensor initialiser for Q, K or V (its files added to `files`)."""
    data = store.data if isinstance(store, QuantTensor) else store
    sp = span(data)
    files[f"{name}.bin"] = sp.raw
    scale = "NULL, 0, 0, NULL, {0, 0, 0}"
    if isinstance(store, QuantTensor):
        sc = span(store.scale)
        files[f"{name}_scale.bin"] = sc.raw
        zp = "NULL"
        if store.zero_point is not None:
            zsp = span(store.zero_point)
            if zsp.offset != sc.offset or zsp.n != sc.n:
                raise ValueError(f"{name}: zero points and scales lie differently")
            files[f"{name}_zero_point.bin"] = zsp.raw
            zp = f'"{name}_zero_point.bin"'
        scale = (f'"{name}_scale.bin", {sc.n}, {sc.offset}, {zp}, '
                 f'{{{", ".join(map(str, sc.strides))}}}')
    return (f'static const saved_tensor SAVED_{name.upper()} = {{"{name}.bin", '
            f"{DTYPE_CODE[data.dtype]}, {data.itemsize}, {sp.n}, {sp.offset}, "
            f'{{{", ".join(map(str, sp.strides))}}}, {scale}}};\n')


def _ints(xs) -> str:
    return "{" + ", ".join(str(int(x)) for x in xs) + "}"


def case_header(case: Case, data, atol: float, rtol: float, files: dict[str, bytes]) -> str:
    """case.h: the call's sizes and flags, where each saved tensor's elements lie, the
    output's layout and poison pattern, and the tolerance (files: the .bin files)."""
    view = out_buffer(case).view
    osp = span(view)
    dt = np.dtype(OUT_NP[case.out_dtype])
    lines = [f"/* {case.id}: {case_in_words(case)} */",
             f'#define CASE_ID "{case.id}"', f'#define CASE_NOTE "{_differs(case)}"',
             *(f"#define {k} {v}LL" for k, v in (
                 ("B", case.batch), ("H", case.n_heads), ("HKV", case.n_kv_heads),
                 ("LQ", case.q_len), ("LKV", case.kv_len), ("D", case.head_dim),
                 ("START_POS", case.start_pos))),
             f"#define IS_CAUSAL {int(case.causal)}",
             f"#define SCALE {float(np.float32(case.scale))!r}f",
             f"#define N_THREADS {case.n_threads}",
             f"#define ATOL {atol!r}", f"#define RTOL {rtol!r}",
             f"#define OUT_DTYPE {DTYPE_CODE[dt]}", f"#define OUT_ELEM_SIZE {dt.itemsize}",
             f"#define OUT_N {osp.n}LL", f"#define OUT_OFFSET {osp.offset}LL",
             f"#define OUT_POISON {POISON[dt][1]:#x}u",
             f"static const int64_t OUT_STRIDE[4] = {_ints(osp.strides)};"]
    if data.mask is not None:
        msp = span(data.mask)
        files["mask.bin"] = msp.raw
        row = msp.strides[0] if case.q_len > 1 else case.kv_len
        lines += ["#define HAS_MASK 1", f"#define MASK_N {msp.n}LL",
                  f"#define MASK_OFFSET {msp.offset}LL", f"#define MASK_ROW_STRIDE {row}LL"]
    else:
        lines += ["#define HAS_MASK 0", "#define MASK_N 0LL", "#define MASK_OFFSET 0LL",
                  "#define MASK_ROW_STRIDE 0LL"]
    lines += [_c_tensor(n, st, files).rstrip() for n, st in
              (("q", data.q_store), ("k", data.k_store), ("v", data.v_store))]
    return "\n".join(lines) + "\n"


def _differs(case: Case) -> str:
    """What the driver's one plain call leaves out of the way probe check calls the case."""
    if case.callers > 1:
        return (f"probe check calls this case from {case.callers} threads at once; the "
                "driver makes one call")
    if case.reuse:
        return ("probe check calls this case twice on the same buffers, new values in the "
                "second; the driver makes the first call")
    if case.stack_kib:
        return f"probe check calls this case on a {case.stack_kib} KiB stack; the driver does not"
    if case.layout == "far":
        return ("the far layout's batches lie 2^31 elements apart in probe check; here they "
                "are packed")
    return ""


def check_save_dir(directory: Path, force: bool) -> None:
    """Refuse a directory that holds anything (unless force): nothing you had is
    overwritten without asking."""
    if directory.exists() and not directory.is_dir():
        raise ProbeError(f"--save {directory} is not a directory")
    if directory.is_dir() and any(directory.iterdir()) and not force:
        raise ProbeError(f"--save {directory} is not empty; give a new directory, or --force "
                         "to write into it")


def save_case(directory: Path, case: Case, data, ref: np.ndarray, atol: float, rtol: float,
              kernel: str | None = None, record: dict | None = None) -> list[Path]:
    """Write the case for its C driver into `directory` (made if missing); the paths."""
    files: dict[str, bytes] = {}
    header = case_header(case, data, atol, rtol, files)
    files["reference.bin"] = np.ascontiguousarray(ref, dtype=np.float64).tobytes()
    text = {"case.h": header, "driver.c": DRIVER_C,
            "Makefile": MAKEFILE.format(kernel=str(Path(kernel).resolve()) if kernel else ""),
            "case.json": json.dumps({"case": case.id, "params": case.params(),
                                     "in_words": case_in_words(case), "atol": atol,
                                     "rtol": rtol, "record": record}, indent=1, default=str)}
    written = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, raw in files.items():
            (directory / name).write_bytes(raw)
            written.append(directory / name)
        for name, body in text.items():
            (directory / name).write_text(body)
            written.append(directory / name)
        shutil.copyfile(INCLUDE_DIR / "sdpa_probe.h", directory / "sdpa_probe.h")
        written.append(directory / "sdpa_probe.h")
    except OSError as exc:
        raise ProbeError(f"cannot write the saved case into {directory}: {exc.strerror}") \
            from None
    return written
