"""The kernels' narrower builds must pass the same checks as the native one:

* portable (no AVX2 / FMA / F16C: GCC vector extensions and scalar conversions),
  what a machine without them, or the -march=native fallback, runs;
* AVX2 (x86-64-v3, plus AVX-VNNI where the CPU has it), what a machine without
  AVX-512 runs for decode: on an AVX-512 machine the native build sends decode to
  the AVX-512 block path, so only this build checks the AVX2 decode tiles, their
  prefetch and the AVX-VNNI int8 Q.K^T on every case."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from sdpa_probe import machine

PORTABLE = "-march=x86-64 -mtune=generic"
AVX2 = "-march=x86-64-v3 -mtune=generic"
X86 = platform.machine() in ("x86_64", "AMD64")


def _build_and_check(cflags: str, suite: str, backends: str | None = None) -> dict:
    probe = Path(sys.executable).parent / "probe"
    env = os.environ | {"SDPA_PROBE_CFLAGS": cflags}
    built = subprocess.run([str(probe), "build", "--json"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    flags = json.loads(built.stdout)["flags"]
    assert all(f in flags for f in cflags.split()) and "-march=native" not in flags
    which = ["-b", backends] if backends else []
    checked = subprocess.run([str(probe), "check", "--suite", suite, *which, "--json", "-"],
                             env=env, capture_output=True, text=True, timeout=600)
    assert checked.returncode == 0, (checked.stdout + checked.stderr)[-3000:]
    doc = json.loads(checked.stdout)
    summary = doc["summary"]
    assert summary["pass"] > 0
    assert summary["fail"] == summary["crash"] == summary["timeout"] == summary["error"] == 0
    return doc


@pytest.mark.skipif(not X86, reason="x86-64 baseline flags")
def test_portable_build_passes_the_smoke_suite():
    doc = _build_and_check(PORTABLE, "smoke")
    passed = {r["backend"] for r in doc["records"] if r["status"] == "pass"}
    assert passed >= {"flash", "quant_int8"}


@pytest.mark.slow  # (a second build of the kernel set, and the default suite on it)
@pytest.mark.skipif(not X86 or not all(machine.isa_flags().get(f) for f in ("avx2", "fma", "f16c")),
                    reason="needs an x86-64 CPU with AVX2, FMA and F16C")
def test_avx2_build_passes_the_default_suite():
    cflags = AVX2 + (" -mavxvnni" if machine.isa_flags().get("avx_vnni") else "")
    # (the kernels with an AVX2 path of their own: quant_int8_alloc is quant_int8's code,
    # and torch is not built with the flags)
    doc = _build_and_check(cflags, "default", "decomposed,flash,flash_maskskip,quant_int8")
    passed = {(r["backend"], r["case"]) for r in doc["records"] if r["status"] == "pass"}
    # decode cases with int8 Q (the integer Q.K^T) and GQA tiles went through the AVX2 path
    assert any(b == "quant_int8" and "i8" in c for b, c in passed)
    assert sum(b == "flash" for b, _ in passed) >= 50
