"""--stress: the scheduling shaker is built and takes every thread start of the process
it is preloaded into; a race that a plain check catches in some runs only (a skip
table built after the threads start) is caught by check --stress, which says how many
rounds ran."""

import json
import os
import subprocess
import sys

import pytest
from fuzz_kernels import split_kernel
from typer.testing import CliRunner

from sdpa_probe.cases.spec import parse_spec
from sdpa_probe.cli import app
from sdpa_probe.fuzz.stress import stress_preload, threaded

RACE_CASE = "family=race,n_heads=4,n_kv_heads=1,q_len=4,kv_len=64,head_dim=16,n_threads=2"


def test_only_threaded_cases_are_stressed():
    assert threaded(parse_spec(RACE_CASE))
    assert threaded(parse_spec("family=x,callers=2"))
    assert threaded(parse_spec("family=x,relation=concurrent"))
    assert not threaded(parse_spec("family=x,reuse=1"))


def test_the_shaker_takes_every_thread_start():
    code = ("import ctypes, threading\n"
            "for _ in range(5):\n"
            "    t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
            "f = ctypes.CDLL(None).sdpa_probe_shaken_threads\n"
            "f.restype = ctypes.c_uint64\n"
            "print(f())\n")
    env = dict(os.environ, LD_PRELOAD=stress_preload())
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert int(out) >= 5


# (some 30 s here: a check, then 20 stress rounds in a second worker)
@pytest.mark.slow
def test_check_stress_catches_a_race_the_plain_run_may_miss(tmp_path):
    kernel = split_kernel(tmp_path, "INIT_RACE")
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["check", "--kernel", str(kernel), "--case", RACE_CASE,
                                   "--stress", "--stress-rounds", "20", "--json", str(out)])
    assert res.exit_code == 1, res.output
    doc = json.loads(out.read_text())
    (rec,) = doc["records"]
    assert rec["status"] == "fail"
    if rec["reason"].startswith("under stress"):
        assert doc["stress"]["cases"] == 1 and 1 <= doc["stress"]["rounds"] <= 20
        assert doc["stress"]["differed"] >= 1
    else:  # (the plain run caught it, as it does in some runs: nothing left to stress)
        assert doc["stress"]["cases"] == 0


# (some 30 s here)
@pytest.mark.slow
def test_fuzz_stress_finds_and_shrinks_the_race(tmp_path):
    kernel = split_kernel(tmp_path, "INIT_RACE")
    out = tmp_path / "f.json"
    res = CliRunner().invoke(app, ["fuzz", "--kernel", str(kernel), "--max-examples", "200",
                                   "--stress", "--stress-rounds", "10", "--no-corpus",
                                   "--json", str(out)])
    assert res.exit_code == 1, res.output
    doc = json.loads(out.read_text())
    assert doc["stress"]["rounds"] > 0
    case = parse_spec(doc["findings"][0]["spec"])
    # (the smallest that fails: two threads, one (batch, head) task, one key)
    assert case.n_threads <= 3 and case.batch == 1 and case.n_heads <= 2
    assert case.kv_len <= 3 and case.q_len <= 2 and case.head_dim <= 3
