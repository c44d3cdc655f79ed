"""The inputs `probe check` makes: NaN slack past kv_len, int8 zero tokens, and the layouts
(offset, far, fenced) that catch kernels assuming aligned, small or in-bounds buffers."""

import numpy as np
import pytest
from kernels_for_tests import SRC, cli_records

from sdpa_probe.cases import Case
from sdpa_probe.check.pool import WorkerPool
from sdpa_probe.inputs import materialise


def test_inputs_carry_nan_slack_past_kv_len():
    case = Case("slack", kv_len=10, layout="padded", q_len=2, n_heads=2, n_kv_heads=1)
    data = materialise(case)
    k = data.k_store
    base = k.base
    while base.base is not None:
        base = base.base
    assert np.isnan(base).sum() > 0 and np.isfinite(k).all()


def test_zero_tokens_give_int8_rows_a_scale_far_above_the_others():
    """The zero-tokens recipe: V rows of zeros every 37th key from the 11th, which int8
    stores with scale 1.0, some 40 times an ordinary token's (its point: docs/check.md's
    `dtype` family)."""
    case = Case("dtype", kv_len=120, dtype="i8", mask="zero-tokens", n_heads=4, n_kv_heads=2)
    data = materialise(case)
    zero = [11, 48, 85]
    assert (data.v[:, zero] == 0).all() and (data.v[:, 12] != 0).any()
    scale = data.v_store.scale[0]                                   # [S, Hkv]
    assert (scale[zero] == 1.0).all()
    assert scale[zero].min() > 20 * np.delete(scale, zero, axis=0).max()
    assert (data.k[:, zero] != 0).any()  # (their keys ordinary: they are attended)


def test_a_kernel_that_assumes_aligned_rows_crashes_on_the_offset_layout(tmp_path):
    """One 16-byte vector load of Q (movaps): every allocation's base is at least 16-byte
    aligned, so the kernel passed every case until the `offset` layout put Q one
    element past a 64-byte boundary, as a view into a cache or a fused projection is."""
    recs = cli_records(tmp_path, "aligned.c", SRC.replace(
        "int st = sdpa_validate_args(a);",
        "int st = sdpa_validate_args(a);\n"
        "  typedef float v4_ __attribute__((vector_size(16)));\n"
        "  if (st == SDPA_OK && a->q.dtype == SDPA_F32 && a->q_len > 0) {\n"
        "    volatile v4_ x_ = *(const v4_ *)a->q.data; (void)x_; }"), "d64-f32")
    crashed = {c for c, r in recs.items() if r["status"] == "crash"}
    # (a reversed view's first element, its last in memory, is no better aligned)
    assert crashed and all(c.endswith(("-offset", "-reversed")) for c in crashed), crashed
    assert any(c.endswith("-offset") for c in crashed)
    assert all(recs[c]["status"] == "pass" for c in recs if c not in crashed)


def test_a_kernel_that_assumes_a_zero_point_array_crashes_on_symmetric_int8(tmp_path):
    """The ABI lets zero_point be NULL (symmetric int8); a kernel that reads it
    unconditionally passed every asymmetric case and dies on every symmetric one."""
    recs = list(cli_records(tmp_path, "zp.c", SRC.replace(
        "int zp = t->zero_point ? t->zero_point[qo] : 0;", "int zp = t->zero_point[qo];"),
        args=("--dtype", "i8")).values())
    crashed = {r["case"] for r in recs if r["status"] == "crash"}
    sym = {r["case"] for r in recs if r["case"].endswith("-sym") or "-sym-" in r["case"]}
    assert crashed == sym != set()
    assert all(r["status"] == "pass" for r in recs if r["case"] not in crashed)


def test_int32_offsets_are_caught_by_the_far_layout(tmp_path):
    """The example with its element offset in int: right on every other case, but batch 1
    of the far layout lies 2^31 + 4096 elements on, so the truncated offset points
    gigabytes before the tensor (a crash, in its worker) or at the wrong element."""
    old = "int64_t off = b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];"
    assert SRC.count(old) == 2
    recs = cli_records(tmp_path, "int_offsets.c",
                        SRC.replace(old, old.replace("int64_t off", "int off")), "far", "layout-h4")
    far = [r for c, r in recs.items() if c.endswith("-far")]
    assert len(far) == 4 and all(r["status"] in ("crash", "fail") for r in far), far
    assert all(r["status"] == "pass" for c, r in recs.items() if "-far" not in c), recs


def test_far_layout_maps_address_space_not_memory():
    case = Case("layout", batch=2, q_len=2, kv_len=70, layout="far", n_heads=4, n_kv_heads=2)
    data = materialise(case)
    k = data.k_store
    assert k.strides[0] == (2 ** 31 + 4096) * 4 and np.isfinite(k).all()
    from sdpa_probe.inputs import input_buffers
    # the input-write guard copies the batches' elements, not the 8 GiB mapping
    assert sum(a.nbytes for a in input_buffers(data).values()) < 1 << 20
    with pytest.raises(ValueError, match="batch >= 2"):
        Case("layout", layout="far")


def test_far_layout_without_the_address_space_is_unavailable():
    """Where the address space cannot be had (strict overcommit, vm.overcommit_memory=2,
    ignores MAP_NORESERVE; here a process limited to 4 GiB of it) the case is
    unavailable (its records `unsupported`), not an error."""
    import subprocess
    import sys

    from sdpa_probe.children import child_env

    script = ("import resource, numpy as np\n"
              "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
              "from sdpa_probe.errors import CaseUnavailable\n"
              "from sdpa_probe.inputs import far_empty\n"
              "try:\n    far_empty((2, 10, 2, 64), np.float32)\n"
              "except CaseUnavailable as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=child_env(), timeout=120)
    assert "cannot map 8 GiB of address space" in out.stdout, out.stdout + out.stderr


def test_a_case_this_machine_cannot_map_is_unsupported_in_the_worker():
    # 2^20 batches 2^31 elements apart: 2^53 bytes, more than any address space
    case = Case("layout", batch=1 << 20, q_len=1, kv_len=1, head_dim=1, n_heads=1,
                n_kv_heads=1, layout="far")
    records: list = []
    WorkerPool(jobs=1, timeout=60).run([(case, ["flash", "decomposed"])], records.append)
    assert [r["status"] for r in records] == ["unsupported", "unsupported"], records
    assert all("not on this machine: layout far: cannot map" in r["reason"] for r in records)


def test_fenced_layouts_put_every_buffer_against_an_inaccessible_page():
    """`fenced`: each buffer's last byte is the last before a PROT_NONE page (the output's
    body too); `fenced-start`: its first byte the first after one. The peers' copies
    (torch, ExecuTorch) meet the same fences."""
    from sdpa_probe.inputs import fenced_tensor, out_buffer
    from sdpa_probe.native import native_lib

    ffi, lib = native_lib()[:2]
    label = ffi.new("char[48]")

    def fence_at(addr: int) -> tuple[int, str]:
        d = lib.sdpa_probe_fence_find(addr, label, 48)
        return d, ffi.string(label).decode() if d else ""

    for layout, after in (("fenced", True), ("fenced-start", False)):
        case = Case("layout", q_len=3, kv_len=45, head_dim=67, dtype="i8", layout=layout,
                    mask="random", n_heads=4, n_kv_heads=2)
        data = materialise(case)
        bufs = {"Q": data.q_store.data, "K": data.k_store.data, "V scales": data.v_store.scale,
                "K zero points": data.k_store.zero_point, "the mask": data.mask,
                "the output": out_buffer(case).view}
        bufs["Q (torch's copy)"] = fenced_tensor(data.q.float(), layout, "Q").numpy()
        for name, a in bufs.items():
            assert a.flags.c_contiguous, name
            first = a.ctypes.data
            probe = first + a.nbytes if after else first - 1
            assert fence_at(probe) == (1, name.split(" (")[0]), (layout, name)
            assert fence_at(first)[0] == 0 and fence_at(first + a.nbytes - 1)[0] == 0
    assert bool(data.k.isfinite().all())  # (no slack, so no NaN fill either)


OVER_READS = {
    # a full 16-float vector loaded over the last K row's tail (head_dim 67)
    "k-tail": ("float s = 0.0f;",
               "float s = 0.0f;\n          { volatile float x_ = load(&a->k, b, j, hk,"
               " (D + 15) / 16 * 16 - 1); (void)x_; }"),
    # the mask read in 16-key blocks, past kv_len
    "mask-block": ("float s = 0.0f;",
                   "float s = 0.0f;\n          if (a->mask) { volatile float x_ = a->mask["
                   "i * a->mask_row_stride + j / 16 * 16 + 15]; (void)x_; }"),
    # the element before each Q row's first (d - 1 at d = 0)
    "q-before": ("float s = 0.0f;",
                 "float s = 0.0f;\n          { volatile float x_ = load(&a->q, b, i, h, -1);"
                 " (void)x_; }"),
}


@pytest.mark.parametrize("bug", list(OVER_READS))
def test_over_reads_whose_values_are_discarded_fault_on_the_fenced_layouts(tmp_path, bug):
    """Reads past a buffer's end (or before its start) whose value the kernel throws away
    reach no output, so the NaN slack cannot show them; in a real runtime they fault when
    the buffer ends a page. The fenced layouts make them fault here, and the record names
    the buffer. Every other case passes."""
    old, new = OVER_READS[bug]
    assert SRC.count(old) == 1
    recs = cli_records(tmp_path, f"{bug}.c", SRC.replace(old, new), "layout-", "d64-f32")
    caught = {c: r for c, r in recs.items() if r["status"] != "pass"}
    want = "-fenced-start" if bug == "q-before" else "-fenced"
    assert caught and all(c.endswith(want) or f"{want}-" in c for c in caught), list(caught)
    buffer = {"k-tail": "K past its end", "mask-block": "the mask past its end",
              "q-before": "Q before its start"}[bug]
    assert all(r["status"] == "crash" and f"the kernel touched {buffer}" in r["reason"]
               for r in caught.values()), caught
