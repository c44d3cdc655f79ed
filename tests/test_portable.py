"""The kernels' portable code (no AVX2 / FMA / F16C: GCC vector extensions and
scalar conversions) is what a machine without them, or the -march=native
fallback, runs: it must pass the same checks as the intrinsics."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

PORTABLE = "-march=x86-64 -mtune=generic"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="x86-64 baseline flags")
def test_portable_build_passes_the_smoke_suite():
    probe = Path(sys.executable).parent / "probe"
    env = os.environ | {"SDPA_PROBE_CFLAGS": PORTABLE}
    built = subprocess.run([str(probe), "build", "--json"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    flags = json.loads(built.stdout)["flags"]
    assert "-march=x86-64" in flags and "-march=native" not in flags
    checked = subprocess.run([str(probe), "check", "--suite", "smoke", "--json", "-"], env=env,
                             capture_output=True, text=True, timeout=600)
    assert checked.returncode == 0, (checked.stdout + checked.stderr)[-3000:]
    doc = json.loads(checked.stdout)
    summary = doc["summary"]
    assert summary["pass"] > 0
    assert summary["fail"] == summary["crash"] == summary["timeout"] == summary["error"] == 0
    passed = {r["backend"] for r in doc["records"] if r["status"] == "pass"}
    assert passed >= {"flash", "quant_int8"}
