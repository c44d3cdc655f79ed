"""`probe check --save DIR` writes a failing case for a standalone C driver: `make` builds
it against the kernel with ASan and UBSan, runs the one case and compares with the saved
reference, failing (exit status and message) where `probe check` failed, passing a
correct kernel, and AddressSanitizer names a read past a tensor."""

import json
import shutil
import subprocess

import pytest
from conftest import EXAMPLE_KERNEL
from kernels_for_tests import BUGS, SRC, runner

from sdpa_probe.cases import judged_tolerance, suite
from sdpa_probe.cli import app
from sdpa_probe.oracle import prepare_case
from sdpa_probe.saved_case import save_case

CASES = {c.id: c for c in suite("default")}
DECODE = "decode-h8gqa4-q4-kv100-d64-f32-causal96"
PADDED = "layout-b2-h4gqa2-q5-kv75-d64-f32-causal70-random-padded"  # strides, mask rows, b2


def _asan_links(tmp_path) -> bool:
    src = tmp_path / "t.c"
    src.write_text("int main(void) { return 0; }\n")
    cc = shutil.which("cc") or shutil.which("gcc")
    return cc is not None and subprocess.run(
        [cc, "-fsanitize=address,undefined", str(src), "-o", str(tmp_path / "t")],
        capture_output=True).returncode == 0


@pytest.fixture
def asan(tmp_path):
    if shutil.which("make") is None or not _asan_links(tmp_path):
        pytest.skip("no make, or no C compiler that links -fsanitize=address,undefined here")


def _make(directory) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(directory)], capture_output=True, text=True,
                          timeout=300)


def _bug(tmp_path, name: str):
    find, replace = BUGS[name]
    path = tmp_path / f"{name}.c"
    path.write_text(SRC.replace(find, replace))
    return path


def test_a_saved_driver_reproduces_the_failure_outside_python(tmp_path, asan):
    kernel = _bug(tmp_path, "ignore-start-pos")
    save = tmp_path / "saved"
    res = runner.invoke(app, ["check", "--kernel", str(kernel), "-k", DECODE, "--save",
                              str(save), "--json", str(tmp_path / "r.json"), "--junit",
                              str(tmp_path / "r.xml")])
    assert res.exit_code == 1, res.output
    case_dir = save / DECODE
    assert f"saved {DECODE}: make -C {case_dir}\n" in res.output  # (one line, to copy)
    rec = json.loads((tmp_path / "r.json").read_text())["records"][0]
    assert rec["diagnosis"]["matches"][0]["hypothesis"] == "start-pos-zero"
    assert "start_pos 96" in rec["case_in_words"]
    junit = (tmp_path / "r.xml").read_text()  # (a CI log shows the diagnosis too)
    assert "diagnosis: your output equals the reference computed with start_pos = 0" in junit
    built = _make(case_dir)
    assert built.returncode != 0, built.stdout + built.stderr
    worst = "b={} q={} h={} d={}".format(*rec["worst"])
    assert f"FAIL {DECODE}: 2048 of 2048 elements outside tolerance" in built.stdout
    assert f"worst at {worst}" in built.stdout  # (the element probe check named)
    assert "-fsanitize=address,undefined" in (case_dir / "Makefile").read_text()
    again = subprocess.run(["./driver"], cwd=case_dir, capture_output=True, text=True)
    assert again.returncode == 1 and again.stdout.startswith("FAIL")
    # a non-empty directory is refused, in one line, unless --force
    res = runner.invoke(app, ["check", "--kernel", str(kernel), "-k", DECODE, "--save",
                              str(save)])
    assert res.exit_code == 2 and "is not empty" in res.output and "--force" in res.output
    assert (case_dir / "driver").exists()


@pytest.mark.parametrize("case_id", [DECODE, PADDED])
def test_a_correct_kernels_driver_passes(tmp_path, asan, case_id):
    case = CASES[case_id]
    prep = prepare_case(case)
    save_case(tmp_path / "c", case, prep.data, prep.ref, *judged_tolerance(case, prep.torch_err),
              str(EXAMPLE_KERNEL))
    built = _make(tmp_path / "c")
    assert built.returncode == 0, built.stdout + built.stderr
    assert built.stdout.startswith(f"PASS {case_id}: max |err|")


def test_asan_names_a_read_past_the_cache(tmp_path, asan):
    """The saved K holds the view's elements and not one more: a kernel reading one key
    past kv_len reads past the buffer, which AddressSanitizer reports."""
    case = CASES["decode-h8gqa4-q1-kv129-d64-f32"]
    prep = prepare_case(case)
    save_case(tmp_path / "c", case, prep.data, prep.ref, *judged_tolerance(case, prep.torch_err),
              str(_bug(tmp_path, "over-read")))
    built = _make(tmp_path / "c")
    assert built.returncode != 0
    assert "AddressSanitizer: heap-buffer-overflow" in built.stderr, built.stderr[-2000:]
