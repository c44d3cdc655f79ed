"""The `args` family: calls with one argument broken, which the ABI says a kernel must
refuse (SDPA_INVALID, nothing written). sdpa_probe/invalid_args.py."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLE_KERNEL
from typer.testing import CliRunner

from sdpa_probe import golden
from sdpa_probe.backends import NativeBackend, TorchBackend, executorch_library
from sdpa_probe.cases import Case, suite
from sdpa_probe.check.calls import run_one
from sdpa_probe.check.pool import WorkerPool
from sdpa_probe.cli import app
from sdpa_probe.errors import ProbeError
from sdpa_probe.invalid_args import INVALID
from sdpa_probe.native import load_user_kernel
from sdpa_probe.oracle import prepare_case

SRC = EXAMPLE_KERNEL.read_text()
VALIDATE = "int st = sdpa_validate_args(a);"
ARGS = [c for c in suite("default") if c.invalid]


def _kernel(tmp_path, name: str, src: str):
    path = tmp_path / name
    path.write_text(src)
    return NativeBackend(str(path), load_user_kernel(path))


def test_the_default_suite_has_one_case_per_invalid_argument():
    assert sorted(c.invalid for c in ARGS) == sorted(INVALID)
    assert all(c.family == "args" and c.id.endswith(f"-invalid-{c.invalid}") for c in ARGS)
    with pytest.raises(ValueError, match="invalid 'nope'"):
        Case("args", invalid="nope")
    with pytest.raises(ValueError, match="plain call"):
        Case("args", invalid="nan-scale", reuse=True)


def test_a_kernel_without_validation_fails_or_crashes_on_every_invalid_call(tmp_path):
    """The example kernel with its sdpa_validate_args call taken out: every invalid call
    is answered (SDPA_OK) or crashes its worker; none is refused."""
    path = tmp_path / "trusting.c"
    path.write_text(SRC.replace(VALIDATE, "int st = SDPA_OK; (void)sdpa_validate_args;"))
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["check", "--kernel", str(path), "-k", "-invalid-",
                                   "--json", str(out)])
    assert res.exit_code == 1, res.output
    recs = [r for r in json.loads(out.read_text())["records"] if r["backend"] == str(path)]
    assert len(recs) == len(INVALID)
    by = {r["case"].rsplit("-invalid-", 1)[1]: r for r in recs}
    for name, r in by.items():
        assert r["status"] in ("fail", "crash"), (name, r)
        if r["status"] == "crash":
            assert "on an invalid call" in r["reason"] and "not refused" in r["reason"], r
        else:
            assert r["reason"].startswith("returned SDPA_OK for an invalid call"), r
    # a NULL buffer is dereferenced, a zero head count divides
    assert by["null-q"]["status"] == by["null-out"]["status"] == "crash"
    assert by["zero-kv-heads"]["status"] == "crash" and "SIGFPE" in by["zero-kv-heads"]["reason"]


def test_a_kernel_that_checks_every_tensor_but_v_is_caught_on_v(tmp_path):
    """A kernel's own check that looks at Q, K and the output but takes V for granted
    (here: the shared check run with K standing in for V) passes every other invalid
    call and dies on a NULL V and an int8 V without its scales."""
    src = SRC.replace(VALIDATE, "sdpa_args c_ = *a;\n  c_.v = c_.k; /* V never looked at */\n"
                                "  int st = sdpa_validate_args(&c_);")
    path = tmp_path / "no_v_check.c"
    path.write_text(src)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["check", "--kernel", str(path), "-k", "-invalid-",
                                   "--json", str(out)])
    assert res.exit_code == 1, res.output
    by = {r["case"].rsplit("-invalid-", 1)[1]: r for r in json.loads(out.read_text())["records"]}
    assert {n for n, r in by.items() if r["status"] != "pass"} == {"null-v",
                                                                   "int8-v-without-scale"}
    assert all(by[n]["status"] == "crash" and "SIGSEGV" in by[n]["reason"]
               for n in ("null-v", "int8-v-without-scale")), by


def test_the_example_and_torch_on_invalid_calls(tmp_path):
    example = NativeBackend("user", load_user_kernel(EXAMPLE_KERNEL))
    for case in ARGS:
        prep = prepare_case(case)
        assert prep.ref is None  # judged on its status: no oracle call
        rec = run_one(example, case, prep)
        assert rec["status"] == "pass" and "returned SDPA_INVALID" in rec["reason"], rec
        # torch through its own API where it can express the call: it raises
        t = run_one(TorchBackend(), case, prep)
        if case.invalid == "heads-not-multiple":
            assert t["status"] == "pass" and t["reason"].startswith("raised RuntimeError"), t
        else:
            assert t["status"] == "unsupported" and "its API cannot make" in t["reason"], t


@pytest.mark.executorch
@pytest.mark.skipif(executorch_library() is None, reason="needs the executorch wheel")
def test_executorch_aborts_on_a_group_that_does_not_divide():
    """Its custom_sdpa asserts (SIGABRT) where it should raise; it answers start_pos -1."""
    cases = [c for c in ARGS if c.invalid in ("heads-not-multiple", "negative-start-pos",
                                              "nan-scale")]
    records = []
    WorkerPool(jobs=1, timeout=60).run([(c, ["executorch"]) for c in cases], records.append)
    by = {r["case"].rsplit("-invalid-", 1)[1]: r for r in records}
    assert by["heads-not-multiple"]["status"] == "crash"
    assert "SIGABRT" in by["heads-not-multiple"]["reason"]
    assert "not refused" in by["heads-not-multiple"]["reason"]
    assert by["negative-start-pos"]["status"] == "fail"
    assert "answered an invalid call (start_pos -1)" in by["negative-start-pos"]["reason"]
    assert by["nan-scale"]["status"] == "unsupported"


def test_writing_the_output_before_refusing_is_caught(tmp_path):
    """Zeroing the output, then validating: the right status, too late."""
    early = SRC.replace(VALIDATE, "if (a && a->out.data && a->abi_version != 1) "
                                  "*(float *)a->out.data = 0.0f;\n  " + VALIDATE)
    backend = _kernel(tmp_path, "early.c", early)
    case = next(c for c in ARGS if c.invalid == "abi-version")
    rec = run_one(backend, case, prepare_case(case))
    assert rec["status"] == "fail", rec
    assert "returned SDPA_INVALID" in rec["reason"] and "but wrote 4 bytes" in rec["reason"]


def test_a_refusal_as_unsupported_is_accepted(tmp_path):
    refuser = '#include "sdpa_probe.h"\nint sdpa_forward(const sdpa_args *a) ' \
              '{ (void)a; return SDPA_UNSUPPORTED; }\n'
    backend = _kernel(tmp_path, "refuser.c", refuser)
    case = ARGS[0]
    rec = run_one(backend, case, prepare_case(case))
    assert rec["status"] == "pass" and "SDPA_UNSUPPORTED" in rec["reason"], rec
    weird = refuser.replace("return SDPA_UNSUPPORTED", "return 7")
    rec = run_one(_kernel(tmp_path, "weird.c", weird), case, prepare_case(case))
    assert rec["status"] == "fail" and "returned 7, not an sdpa_status" in rec["reason"]


def test_list_shows_no_tolerance_for_an_invalid_call():
    res = CliRunner().invoke(app, ["check", "--list", "-k", "invalid-nan-scale", "--json", "-"])
    assert res.exit_code == 0, res.output
    (c,) = json.loads(res.stdout)["cases"]
    assert c["atol"] is None and c["rtol"] is None and c["params"]["invalid"] == "nan-scale"


def test_golden_data_leaves_invalid_calls_out():
    assert not any(c.invalid for c in golden.reference_suite("default"))
    with pytest.raises(ProbeError, match="only invalid-argument cases"):
        golden.select_cases(["-invalid-"], "default")
    assert golden.store(golden.default_dir()).missing(ARGS) == []
