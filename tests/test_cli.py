"""CliRunner tests for `probe build`, `probe kernels`, `probe run` and the help texts."""

import json

import pytest
from typer.testing import CliRunner

from sdpa_probe.cli import app

runner = CliRunner()


def test_help_lists_commands():
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    for cmd in ("build", "kernels", "check", "run"):
        assert cmd in res.output


def test_version():
    from sdpa_probe import __version__

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"sdpa_probe {__version__}"


@pytest.mark.parametrize("cmd", ["build", "kernels", "check", "run"])
def test_subcommand_help(cmd):
    res = runner.invoke(app, [cmd, "--help"])
    assert res.exit_code == 0 and "Usage" in res.output


def test_kernels_json_lists_the_kernel_set():
    res = runner.invoke(app, ["kernels", "--json"])
    assert res.exit_code == 0
    names = [k["name"] for k in json.loads(res.stdout)["kernels"]]
    for n in ("decomposed", "flash", "flash_maskskip", "quant_int8", "quant_int8_alloc"):
        assert n in names


def test_build_json_reports_module():
    res = runner.invoke(app, ["build", "--json"])
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert doc["path"].endswith(".so") and "-O3" in doc["flags"]


def test_build_bad_compiler_is_one_line():
    res = runner.invoke(app, ["build", "--cc", "/nonexistent/cc", "--force"])
    assert res.exit_code == 2
    assert res.output.strip().startswith("error:") and len(res.output.strip().splitlines()) == 1


def test_run_checks_and_times_one_shape():
    res = runner.invoke(app, ["run", "flash", "--heads", "8", "--kv-heads", "2", "--kv-len", "300",
                              "--q-len", "3", "--causal", "--start-pos", "297", "--repeat", "2",
                              "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["status"] == "pass" and doc["median_us"] > 0 and doc["bytes"] > 0


def test_run_a_float_query_over_an_f16_cache():
    res = runner.invoke(app, ["run", "flash", "--dtype", "f16", "--q-dtype", "f32", "--heads", "8",
                              "--kv-heads", "2", "--kv-len", "200", "--repeat", "2", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["status"] == "pass" and doc["case"].endswith("-qf32-t0")


@pytest.mark.parametrize("argv,msg", [
    (["run", "nosuch"], "unknown kernel"),
    (["run", "--heads", "6", "--kv-heads", "4"], "not a multiple"),
    (["run", "--kv-len", "-1"], "--kv-len must be >= 0"),
    (["run", "--head-dim", "0"], "--head-dim must be >= 1"),
    (["run", "--dtype", "f64"], "unknown dtype"),
    (["run", "--q-dtype", "f32"], "--q-dtype 'f32': f32"),
    (["run", "--dtype", "f16", "--q-dtype", "f16"], "over a f16, bf16 or i8 cache"),
])
def test_run_bad_input(argv, msg):
    res = runner.invoke(app, argv)
    assert res.exit_code == 2
    assert msg in res.output and "Traceback" not in res.output


def test_commands_warn_when_the_kernels_run_a_portable_build(monkeypatch):
    import dataclasses

    from sdpa_probe import native

    ffi, lib, res = native.native_lib()
    fake = dataclasses.replace(res, fallback=True, fallback_reason="x.c:1: error: boom")
    monkeypatch.setattr(native, "native_lib", lambda: (ffi, lib, fake))
    out = runner.invoke(app, ["bench", "--shape", "decode-h4kv1d64-kv64-f32", "--vs", "",
                              "--rounds", "1", "--min-time", "0", "--json", "-"])
    assert out.exit_code == 0, out.output
    assert "portable flags" in out.stderr and "boom" in out.stderr
    json.loads(out.stdout)  # the document stays clean
    monkeypatch.setattr(native, "native_lib", lambda: (ffi, lib, res))
    out = runner.invoke(app, ["bench", "--shape", "decode-h4kv1d64-kv64-f32", "--vs", "",
                              "--rounds", "1", "--min-time", "0", "--json", "-"])
    assert out.exit_code == 0 and "portable" not in out.stderr


@pytest.mark.parametrize("cmd", [["check", "--suite", "smoke", "--kernel"], ["bench", "--shape",
                                  "decode-h32kv8d64-kv512-f32", "--rounds", "1", "--kernel"]])
def test_a_kernel_file_without_sdpa_forward_is_a_usage_error(tmp_path, cmd):
    k = tmp_path / "mine.c"
    k.write_text('#include "sdpa_probe.h"\n'
                 "int my_sdpa(const sdpa_args *a) { (void)a; return 0; }\n")
    res = runner.invoke(app, [*cmd, str(k)])
    assert res.exit_code == 2, res.output
    assert "mine.c does not define sdpa_forward" in res.output and "Traceback" not in res.output


def test_failures_of_one_kind_print_once_with_the_other_ids():
    from sdpa_probe.cli.check_render import GROUP_AT, group_failures
    from sdpa_probe.records import Record

    def rec(case, reason, backend="k.c", status="fail"):
        return Record(backend, case, "decode", status=status, reason=reason)

    records = [rec("a", "error above tolerance at 3 elements: worst |err| 0.5 at b=0 q=1"),
               rec("b", "1 output elements never written (poison left), first at b=0 q=0"),
               rec("c", "error above tolerance at 12 elements: worst |err| 2e-3 at b=1 q=7"),
               rec("p", "", status="pass"),
               rec("d", "error above tolerance at 1 elements: worst |err| 7.25e+04 at b=0 q=0"),
               rec("e", "error above tolerance at 1 elements: worst |err| 1 at b=0 q=0",
                   backend="flash"),
               rec("f", "2 output elements never written (poison left), first at b=0 q=3")]
    groups = [(r["case"], [o["case"] for o in others]) for r, others in group_failures(records)]
    assert GROUP_AT == 3
    assert groups == [("a", ["c", "d"]), ("b", []), ("e", []), ("f", [])]


def test_check_prints_a_kind_of_failure_once_unless_asked_for_each(tmp_path):
    from conftest import EXAMPLE_KERNEL

    bad = tmp_path / "gqa_mod.c"
    bad.write_text(EXAMPLE_KERNEL.read_text().replace(
        "const int64_t hk = h / group;", "const int64_t hk = h % a->n_kv_heads;"))
    res = runner.invoke(app, ["check", "--kernel", str(bad), "-k", "gqa-h8gqa", "-k",
                              "gqa-h32gqa"], terminal_width=100)
    assert res.exit_code == 1
    flat = " ".join(res.output.split())
    assert "more failing the same way (figures aside)" in flat
    import re

    n_fail = int(re.search(r"pass, (\d+) fail", flat).group(1))  # (the summary line)
    assert n_fail >= 3 and flat.count("--repro") < n_fail
    res = runner.invoke(app, ["check", "--kernel", str(bad), "-k", "gqa-h8gqa", "-k",
                              "gqa-h32gqa", "--each-failure"], terminal_width=100)
    flat = " ".join(res.output.split())
    assert "same way" not in flat and flat.count("--repro") == n_fail
