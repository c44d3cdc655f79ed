"""The C ABI's contract: argument validation, exact alignment arithmetic, the build cache."""

import numpy as np
import pytest
from conftest import EXAMPLE_KERNEL, needs_cxx

from sdpa_probe import build, native
from sdpa_probe.errors import BuildError, ProbeError, SdpaInvalid

KERNELS = ["decomposed", "flash", "flash_maskskip", "quant_int8", "quant_int8_alloc"]


def test_align_up_exact_for_small_x_and_powers_of_two():
    _, lib, _ = native.native_lib()
    for shift in range(0, 11):
        a = 1 << shift
        for x in range(0, 3000):
            assert lib.sdpa_probe_align_up(x, a) == -(-x // a) * a, (x, a)


def test_align_up_rejects_non_powers_of_two():
    _, lib, _ = native.native_lib()
    for a in (0, -4, 3, 6, 12, 96):
        assert lib.sdpa_probe_align_up(10, a) == -1


def test_align_up_with_the_a_minus_1_mask_is_wrong():
    """(x + a - 1) & -(a - 1) keeps bit 0 of the mask: it misaligns odd results."""
    a = 32
    wrong = [(x, (x + a - 1) & -(a - 1)) for x in range(1, 200) if ((x + a - 1) & -(a - 1)) % a]
    assert wrong, "the old expression should misalign some x"


def _args(rng, dtype=np.float32, B=1, Lq=2, H=4, Hkv=2, D=16, Lkv=10):
    q = rng.standard_normal((B, Lq, H, D)).astype(dtype)
    k = rng.standard_normal((B, Lkv, Hkv, D)).astype(dtype)
    v = rng.standard_normal((B, Lkv, Hkv, D)).astype(dtype)
    out = np.zeros((B, Lq, H, D), np.float32)
    ffi, _, _ = native.native_lib()
    return native.prepare(ffi, q, k, v, out), out


CORRUPTIONS = {
    "abi-version": lambda a: setattr(a, "abi_version", 99),
    "heads-not-multiple": lambda a: setattr(a, "n_kv_heads", 3),
    "negative-kv": lambda a: setattr(a, "kv_len", -1),
    "negative-batch": lambda a: setattr(a, "batch", -2),
    "zero-head-dim": lambda a: setattr(a, "head_dim", 0),
    "zero-kv-heads": lambda a: setattr(a, "n_kv_heads", 0),
    "negative-start-pos": lambda a: setattr(a, "start_pos", -1),
    "null-q": lambda a: setattr(a.q, "data", native.native_lib()[0].NULL),
    "null-out": lambda a: setattr(a.out, "data", native.native_lib()[0].NULL),
    "bad-dtype": lambda a: setattr(a.k, "dtype", 7),
    "int8-out": lambda a: setattr(a.out, "dtype", 3),
    "int8-without-scale": lambda a: setattr(a.k, "dtype", 3),
    "nan-scale": lambda a: setattr(a, "scale", float("nan")),
}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("what", list(CORRUPTIONS))
def test_bad_arguments_return_invalid(rng, kernel, what):
    call, out = _args(rng)
    CORRUPTIONS[what](call.args)
    before = out.copy()
    assert native.get_kernel(kernel).forward_args(call.args) == 2
    np.testing.assert_array_equal(out, before)  # nothing written


def test_wrapper_checks_shapes(rng):
    q = np.zeros((1, 2, 4, 16), np.float32)
    k = np.zeros((1, 5, 3, 16), np.float32)
    with pytest.raises(ValueError, match="multiple"):
        native.get_kernel("flash")(q, k, k, np.zeros_like(q))
    with pytest.raises(ValueError, match="out"):
        native.get_kernel("flash")(q, k[:, :, :2], k[:, :, :2], np.zeros((1, 2, 4, 8), np.float32))


def test_unsupported_status_raises(rng):
    from sdpa_probe.errors import SdpaUnsupported

    call, _ = _args(rng)
    with pytest.raises(SdpaUnsupported):
        native.raise_for_status(native.get_kernel("quant_int8").forward_args(call.args), "q")
    with pytest.raises(SdpaInvalid):
        native.raise_for_status(2, "x")


def test_build_is_cached_and_keyed_by_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(tmp_path))
    spec = native.user_kernel_spec(EXAMPLE_KERNEL)
    r1 = build.build(spec)
    assert not r1.cached and r1.path.exists() and r1.path.parent == tmp_path
    r2 = build.build(spec)
    assert r2.cached and r2.path == r1.path
    r3 = build.build(spec, cflags="-O1")
    assert r3.path != r1.path and "-O1" in r3.flags
    assert not list(tmp_path.glob("sdpa_probe_build_*")), "temp build dirs must be cleaned up"


def test_bad_compiler_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(tmp_path))
    spec = native.user_kernel_spec(EXAMPLE_KERNEL)
    with pytest.raises(BuildError, match="cannot be run"):
        build.build(spec, cc="/nonexistent/cc")


def test_broken_kernel_source_is_a_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "bad.c"
    bad.write_text('#include "sdpa_probe.h"\nint sdpa_forward(const sdpa_args *a) { return x; }\n')
    with pytest.raises(BuildError) as err:
        native.load_user_kernel(bad)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("body,msg", [
    ("int sdpa_forwrd(const sdpa_args *a) { (void)a; return 0; }", "does not define sdpa_forward"),
    ("int helper(const sdpa_args *a);\nint sdpa_forward(const sdpa_args *a) { return helper(a); }",
     "uses helper, which it does not define"),
])
def test_kernel_that_does_not_link_is_a_one_line_error(tmp_path, monkeypatch, body, msg):
    """It compiles; the dynamic loader refuses it (this had been a traceback)."""
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "k.c"
    bad.write_text('#include "sdpa_probe.h"\n' + body + "\n")
    with pytest.raises(BuildError, match=msg) as err:
        native.load_user_kernel(bad)
    assert "\n" not in str(err.value)


def test_user_kernel_must_exist():
    with pytest.raises(ProbeError, match="not found"):
        native.load_user_kernel("/nonexistent/k.c")


def test_failed_native_build_falls_back_with_its_reason(tmp_path, monkeypatch):
    """A compiler that rejects -march=native (or a source that only fails under it) gives
    the portable build, and the result says why, so that the commands can warn."""
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(tmp_path / "cache"))
    cc = tmp_path / "cc-no-native"
    cc.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = -march=native ] && '
                  '{ echo "error: no native target here" >&2; exit 1; }; done\nexec gcc "$@"\n')
    cc.chmod(0o755)
    res = build.build(native.user_kernel_spec(EXAMPLE_KERNEL), cc=str(cc))
    assert res.fallback and "-march=native" not in res.flags
    assert "no native target here" in res.fallback_reason
    again = build.build(native.user_kernel_spec(EXAMPLE_KERNEL), cc=str(cc))
    assert again.cached and again.fallback and "no native target here" in again.fallback_reason


def test_sources_compile_in_parallel(tmp_path, monkeypatch):
    """Each source is its own compiler run, two at a time with two CPUs: a compiler
    that waits (up to 20 s) for the other to start sees it when they overlap."""
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_build_jobs", lambda: 2)
    runs = tmp_path / "runs"
    runs.mkdir()
    cc = tmp_path / "cc-meet"
    cc.write_text(f'#!/bin/sh\ncase " $* " in *" -c "*"/src_"*)\n'
                  f'  touch {runs}/$$; i=0\n'
                  f'  while [ "$(ls {runs} | wc -l)" -lt 2 ] && [ $i -lt 200 ]; do\n'
                  f'    sleep 0.1; i=$((i+1))\n  done\n'
                  f'  ls {runs} | wc -l > {runs}.$$;;\nesac\nexec gcc "$@"\n')
    cc.chmod(0o755)
    srcs = []
    for name in ("a", "b"):
        src = tmp_path / f"src_{name}.c"
        src.write_text(f"int probe_{name}(void) {{ return 1; }}\n")
        srcs.append(src)
    spec = build.BuildSpec(stem="two_sources", cdef="int probe_a(void); int probe_b(void);",
                           source="int probe_a(void); int probe_b(void);\n", sources=tuple(srcs))
    mod = build.load(build.build(spec, cc=str(cc)))
    assert mod.lib.probe_a() + mod.lib.probe_b() == 2
    seen = [int(p.read_text()) for p in tmp_path.glob("runs.*")]
    assert len(seen) == 2 and min(seen) == 2, seen


# ---- C++ kernels ------------------------------------------------------------------

CXX_EXAMPLE = EXAMPLE_KERNEL.with_name("minimal_sdpa.cpp")


@needs_cxx
def test_cxx_kernel_builds_with_the_cxx_driver_and_its_own_key(tmp_path, monkeypatch):
    """A .cpp kernel compiles as C++17 (minimal_sdpa.cpp uses std::thread and
    exceptions, so the link needs the C++ runtime) and the C++ compiler is in the key."""
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(tmp_path))
    spec = native.user_kernel_spec(CXX_EXAMPLE)
    assert spec.has_cxx and not native.user_kernel_spec(EXAMPLE_KERNEL).has_cxx
    res = build.build(spec)
    assert res.cxx and not res.cached
    mod = native.load_user_module(res, CXX_EXAMPLE)
    assert hasattr(mod.lib, "sdpa_forward")
    k = build._key(spec, ["cc"], "v", ["-O3"], (["g++"], "g++ 12"))
    assert k != build._key(spec, ["cc"], "v", ["-O3"], (["clang++"], "clang 15"))


def test_cxx_flags_swap_only_the_language_standard():
    assert build.cxx_flags(["-std=c11", "-O3", "-Wall"]) == [build.CXX_STD, "-O3", "-Wall"]


def test_cxx_compiler_is_found_beside_the_c_one(monkeypatch, tmp_path):
    monkeypatch.delenv("CXX", raising=False)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("gcc-12", "g++-12", "x86_64-linux-gnu-clang", "x86_64-linux-gnu-clang++"):
        (bindir / name).write_text("#!/bin/sh\n")
        (bindir / name).chmod(0o755)
    assert build.cxx_command([str(bindir / "gcc-12"), "-m64"]) == [str(bindir / "g++-12"), "-m64"]
    assert build.cxx_command([str(bindir / "x86_64-linux-gnu-clang")]) == [
        str(bindir / "x86_64-linux-gnu-clang++")]
    monkeypatch.setenv("CXX", "my-c++ --flag")
    assert build.cxx_command(["gcc"]) == ["my-c++", "--flag"]


def test_no_cxx_compiler_is_a_one_line_error(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(build.shutil, "which", lambda _name: None)
    with pytest.raises(BuildError, match="no C\\+\\+ compiler found .* set \\$CXX"):
        build.cxx_command(["/opt/weird/mycc"])


@needs_cxx
def test_broken_cxx_kernel_is_a_one_line_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "bad.cc"
    bad.write_text('#include "sdpa_probe.h"\n'
                   'extern "C" int sdpa_forward(const sdpa_args *a) { return nosuch(a); }\n')
    with pytest.raises(BuildError, match="bad.cc:2:.*nosuch") as err:
        native.load_user_kernel(bad)
    assert "\n" not in str(err.value)


def test_kernel_suffixes_are_named_in_the_error(tmp_path):
    other = tmp_path / "k.rs"
    other.write_text("")
    with pytest.raises(ProbeError, match=r"\.c, \.cpp or \.so"):
        native.user_kernel_spec(other)


def test_call_watched_copies_the_output_as_the_call_returns_and_refuses_null():
    ffi, lib, _ = native.native_lib()
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 1, 4, 16), dtype=np.float32)
    k = rng.standard_normal((1, 9, 2, 16), dtype=np.float32)
    v = rng.standard_normal((1, 9, 2, 16), dtype=np.float32)
    out = np.zeros_like(q)
    copy = np.full_like(out, np.nan)
    call = native.prepare(ffi, q, k, v, out)
    flash = native.get_kernel("flash")
    assert flash.forward_watched(call.args, out, copy) == 0
    assert np.any(out != 0) and np.array_equal(copy, out)
    buf = ffi.from_buffer(out)
    assert lib.sdpa_probe_call_watched(ffi.NULL, flash.info.index, ffi.NULL, buf, buf, 4) == 2
    assert lib.sdpa_probe_call_watched(ffi.NULL, flash.info.index, call.args, ffi.NULL, buf,
                                       4) == 2
