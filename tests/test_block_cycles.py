"""benchmarks/block_cycles.py: the AVX-512 decode block timed alone, phase by
phase. Its usage errors are checked always; a real build and run (about a minute
of compiling) is opt-in with -m slow and guards a ratio only, never a time."""

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    path = ROOT / "benchmarks" / "block_cycles.py"
    spec = importlib.util.spec_from_file_location("block_cycles", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("args, says", [
    (["--dtype", "f64"], "unknown dtype"),
    (["--rows", "3"], "rows 1/2/4/8/16"),
    (["--head-dim", "72"], "multiple of 16"),
    (["--cc", "no-such-compiler-here"], "no C compiler"),
])
def test_bad_arguments_are_one_line_usage_errors(capsys, args, says):
    assert _tool().main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0]


def _avx512_cpu() -> bool:
    """What the block path needs from -march=native (flash_x512.h: F, BW, DQ, VL)."""
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= words


@pytest.mark.slow
def test_block_cycles_builds_runs_and_attributes_the_phases(tmp_path):
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None or not _avx512_cpu():
        pytest.skip("needs a C compiler and an AVX-512 (F, BW, DQ, VL) CPU")
    out = tmp_path / "cycles.json"
    assert _tool().main(["--dtype", "iq", "--blocks", "2", "--seconds", "0.05", "--repeat", "3",
                         "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    c, ph = r["cycles_per_key_head"], r["phases"]
    assert set(c) == {"block", "no scores", "no softmax", "no P.V"}
    assert 1.0 < r["clock_ghz"] < 10.0 and all(v > 0 for v in c.values())
    # P.V is about half of int8's block at 4 rows per head (16 FMAs a (key, kv head)):
    # leaving it out must save a clear share, whatever the machine's noise
    assert c["no P.V"] < 0.9 * c["block"] and ph["P.V"] > 0
    assert abs(sum(ph.values()) - c["block"]) < 0.05
