"""Bad input to any command: one line on stderr starting with "error:", exit code 2 (or
the documented one), never a traceback, and nothing of the user's overwritten."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sdpa_probe.cli import app

runner = CliRunner()

SHAPE = "decode-h4kv1d64-kv64-f32"
CASE = "decode-h8gqa4-q1-kv129-d64-f32"  # of the smoke suite
PROFILE = ["profile", "-m", "smollm2-135m", "--context", "16", "--steps", "1", "--warmup", "0",
           "--no-roofline"]
SEGFAULT = '#include "sdpa_probe.h"\nint sdpa_forward(const sdpa_args *a) {\n' \
           '  (void)a; volatile int *p = 0; *p = 1; return 0;\n}\n'


def _usage_error(argv, msg, code=2, **kw):
    """One "error:" line on stderr with msg, exit code 2 (a usage error; 1: a problem
    found in the kernel)."""
    res = runner.invoke(app, argv, **kw)
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    assert msg in res.output, res.output
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and msg in err[0], res.stderr
    return res


@pytest.fixture
def segfault_kernel(tmp_path):
    path = tmp_path / "segv.c"
    path.write_text(SEGFAULT)
    return path


@pytest.fixture
def no_entry_kernel(tmp_path):
    path = tmp_path / "empty.c"
    path.write_text("")
    return path


# ---- numbers ------------------------------------------------------------------------

@pytest.mark.parametrize("threads", ["100000", "-3"])
def test_bench_threads_out_of_range(threads):
    # 100000 had torch.set_num_threads(100000) kill the process at exit (SIGSEGV)
    _usage_error(["bench", "--shape", SHAPE, "--threads", threads],
                 f"--threads must be between 1 and 64 (0: all cores), got {threads}")


def test_bench_min_time_inf():
    _usage_error(["bench", "--shape", SHAPE, "--min-time", "inf"],
                 "--min-time must be at most 60 seconds (a batch of calls a round), got inf")


@pytest.mark.parametrize("timeout", ["inf", "1e7"])
def test_check_timeout_too_large(timeout):
    _usage_error(["check", "--suite", "smoke", "-b", "flash", "--timeout", timeout],
                 "--timeout must be at most 86400 s (a day)")


@pytest.mark.parametrize("argv", [
    ["check", "--suite", "smoke", "-b", "flash", "--seed", "-1"],  # had been exit 1 (error)
    ["check", "--repro", CASE, "-b", "flash", "--seed", "-1"],     # had been a traceback
    ["run", "--seed", "-1"],                                        # had been exit 1 (error)
    ["sizing", "-w", "4", "--chunk", "2", "--seed", "-1"],               # had been a traceback
])
def test_negative_seed(argv):
    _usage_error(argv, "--seed must be >= 0, got -1")


def test_bench_shape_too_large_for_memory():
    _usage_error(["bench", "--shape", "decode-h32kv8d64-kv999999999999-f32", "--vs", "",
                  "--rounds", "1", "--min-time", "0"],
                 "shape decode-h32kv8d64-kv999999999999-f32 does not fit in memory")


# ---- lists --------------------------------------------------------------------------

def test_check_dtype_list_tolerates_a_trailing_comma_and_refuses_an_empty_one():
    # 'f32,' had been "unknown dtype ''"; the filter now runs (and -k matches nothing)
    _usage_error(["check", "--suite", "smoke", "-b", "flash", "--dtype", "f32,", "-k", "nosuch"],
                 "no case matches the filters")
    _usage_error(["check", "--suite", "smoke", "-b", "flash", "--dtype", ","],
                 "--dtype is empty; known: f32, f16, bf16, i8")


@pytest.mark.parametrize("cases", ["", ",", " , "])
def test_golden_regen_empty_cases(cases, tmp_path):
    _usage_error(["golden", "regen", "--cases", cases, "--dir", str(tmp_path), "--dry-run"],
                 "--cases is empty")


# ---- output paths: checked before the work ------------------------------------------

@pytest.mark.parametrize("argv,msg", [
    (["bench", "--shape", SHAPE, "--json", "/nonexistent/dir/x.json"],
     "cannot write --json /nonexistent/dir/x.json: no directory /nonexistent/dir"),
    (["check", "--suite", "smoke", "-b", "flash", "--json", "/nonexistent/x.json"],
     "cannot write --json /nonexistent/x.json: no directory /nonexistent"),
    (["check", "--suite", "smoke", "-b", "flash", "--junit", "{tmp}"],
     "cannot write --junit {tmp}: it is a directory"),
    (PROFILE + ["--csv", "{tmp}"], "cannot write --csv {tmp}: it is a directory"),
    (PROFILE + ["--trace", "{file}/x.json"], "{file} is not a directory"),
    # the session would have been lost at its end
    (PROFILE + ["-i", "--script", "--json", "/nonexistent/s.json"],
     "cannot write --json /nonexistent/s.json"),
])
def test_output_path_is_checked_before_the_work(argv, msg, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    fill = {"tmp": str(tmp_path), "file": str(f)}
    _usage_error([a.format(**fill) for a in argv], msg.format(**fill), input="quit\n")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_output_path_is_opened_before_the_work():
    # root passes os.access there; only opening the file shows the write would fail
    _usage_error(["bench", "--shape", SHAPE, "--json", "/proc/sdpa-probe-x.json"],
                 "cannot write --json /proc/sdpa-probe-x.json: No such file or directory")


def test_output_path_check_leaves_files_as_they_were(tmp_path):
    from sdpa_probe.cli.output import check_writable
    from sdpa_probe.errors import ProbeError
    kept, ours = tmp_path / "old.json", tmp_path / "report.json"
    kept.write_text("the user's data")
    ours.write_text('{"schema": "sdpa_probe.check/1", "records": []}')
    with pytest.raises(ProbeError, match="is not one of probe's reports; refusing to overwrite"):
        check_writable(str(kept), "--json")
    check_writable(str(ours), "--json")
    check_writable(str(tmp_path / "new.json"), "--json")
    assert kept.read_text() == "the user's data"
    assert ours.read_text() == '{"schema": "sdpa_probe.check/1", "records": []}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json", "report.json"]


USERS_FILE = "my notes, not a report\n"


@pytest.mark.parametrize("argv", [
    ["check", "--suite", "smoke", "-b", "flash", "--json", "{file}"],
    ["check", "--suite", "smoke", "-b", "flash", "--junit", "{file}"],
    ["bench", "--shape", SHAPE, "--json", "{file}"],
    PROFILE + ["--json", "{file}"],
    PROFILE + ["--csv", "{file}"],
    PROFILE + ["--trace", "{file}"],
    PROFILE[:4] + ["16,32"] + PROFILE[5:] + ["--chart", "{file}.svg"],
], ids=["check-json", "check-junit", "bench-json", "profile-json", "profile-csv",
        "profile-trace", "profile-chart"])
def test_an_existing_file_that_is_no_report_is_not_overwritten(argv, tmp_path):
    # a mistyped path (--json README.md) is refused before the work, not lost after it
    f = tmp_path / "notes"
    f.write_text(USERS_FILE)
    (tmp_path / "notes.svg").write_text(USERS_FILE)
    args = [a.format(file=f) for a in argv]
    path = next(a for a in args if a.startswith(str(f)))
    option = args[args.index(path) - 1]
    _usage_error(args, f"cannot write {option} {path}: it exists and is not one of probe's "
                       "reports; refusing to overwrite it")
    assert f.read_text() == USERS_FILE and (tmp_path / "notes.svg").read_text() == USERS_FILE


def test_a_command_rerun_overwrites_its_own_report(tmp_path):
    out, junit = tmp_path / "out.json", tmp_path / "out.xml"
    argv = ["check", "--suite", "smoke", "-b", "flash", "-k", CASE, "--json", str(out),
            "--junit", str(junit)]
    for _ in range(2):
        res = runner.invoke(app, argv)
        assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["tool"]["name"] == "sdpa_probe" and len(doc["records"]) == 1
    assert junit.read_text().count("<testcase ") == 1


@pytest.mark.parametrize("text,ours", [
    ("", True),
    ('{"schema": "sdpa_probe.check/1"}', True),
    ('{"tool": {"name": "sdpa_probe", "version": "0.1.0"}, "results": []}', True),
    # written before reports named their writer: probe bench's, probe profile's
    ('{"schema": 1, "mode": "warm", "peers": {}, "results": []}', True),
    ('{"model": {}, "weights": "f16", "cache": "f16", "builds": {}, "steps": 20}', True),
    ('{"interactive": true, "runs": []}', True),
    ('{"traceEvents": [], "otherData": {"sdpa_probe": "0.1.0"}}', True),
    ("<?xml version='1.0' encoding='utf-8'?>\n<testsuites name=\"probe check\" time=\"1\">", True),
    ('<svg xmlns="http://www.w3.org/2000/svg">\n<title>probe profile: time per op</title>', True),
    ('{"schema": 1, "results": []}', False),
    ('{"traceEvents": []}', False),
    ("[1, 2, 3]", False),
    ("{not json", False),
    ("<?xml version='1.0'?>\n<testsuites name=\"pytest\">", False),
    ("attention,kernel\n", False),
    ("# sdpa_probe\n", False),
])
def test_what_counts_as_an_earlier_report(text, ours, tmp_path):
    from sdpa_probe.cli.output import _not_a_report
    f = tmp_path / "f"
    f.write_text(text)
    assert (_not_a_report(f) is None) == ours


def test_a_profile_csv_header_counts_as_a_report(tmp_path):
    from sdpa_probe.cli.output import _not_a_report
    from sdpa_probe.profile.report import CSV_FIELDS
    f = tmp_path / "p.csv"
    f.write_text(",".join(CSV_FIELDS) + ",cpu\nfused,flash,16\n")
    assert _not_a_report(f) is None


def test_output_never_overwrites_the_kernel_file(tmp_path):
    kernel = tmp_path / "k.c"
    kernel.write_text(SEGFAULT)
    for argv in (["bench", "--kernel", str(kernel), "--shape", SHAPE, "--json", str(kernel)],
                 ["check", "--kernel", str(kernel), "--junit", str(kernel)],
                 PROFILE + ["--kernel", str(kernel), "--csv", str(kernel)]):
        _usage_error(argv, "it is an input of this command (a kernel file); refusing to "
                           "overwrite it")
    assert kernel.read_text() == SEGFAULT


def test_check_save_into_a_file(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("keep")
    # had been a FileExistsError traceback from mkdir, after the run
    _usage_error(["check", "--repro", CASE, "-b", "flash", "--save", str(f)],
                 f"--save {f} is not a directory")
    _usage_error(["check", "--repro", CASE, "-b", "flash", "--save", str(f / "sub")],
                 f"cannot write the reproduction into {f / 'sub'}: Not a directory")
    assert f.read_text() == "keep"


# ---- compiler, flags, build cache -----------------------------------------------------

@pytest.mark.parametrize("argv,env,msg", [
    (["build", "--cflags", '"-O2'], None, "compiler flags '\"-O2': no closing quotation"),
    (["build", "--cc", '"gcc'], None, "--cc '\"gcc': no closing quotation"),
    (["build"], {"SDPA_PROBE_CFLAGS": "'-O2"},
     "$SDPA_PROBE_CFLAGS \"'-O2\": no closing quotation"),
    (PROFILE + ["--ab", 'fused@"-O1,decomposed'], None,
     "compiler flags '\"-O1': no closing quotation"),
])
def test_unbalanced_quote_in_compiler_words(argv, env, msg):
    _usage_error(argv, msg, env=env)


def test_compiler_that_writes_nothing(tmp_path):
    from conftest import EXAMPLE_KERNEL

    # had been a FileNotFoundError traceback from os.replace
    _usage_error(["build", "--kernel", str(EXAMPLE_KERNEL), "--cc", "/bin/true"],
                 "/bin/true exited 0 but wrote no _sdpa_probe_user_")


def test_build_cache_is_a_file(tmp_path):
    f = tmp_path / "cache"
    f.write_text("")
    _usage_error(["build"], f"cannot use the build cache {f}: not a directory",
                 env={"SDPA_PROBE_CACHE": str(f)})


# ---- kernel files ----------------------------------------------------------------------

def test_build_kernel_without_sdpa_forward(no_entry_kernel):
    # had been exit 0: built, reported as built, unusable
    _usage_error(["build", "--kernel", str(no_entry_kernel)],
                 "empty.c does not define sdpa_forward")


def test_profile_kernel_without_sdpa_forward(no_entry_kernel):
    # had been the loader's "cannot load ...so: undefined symbol: sdpa_forward"
    _usage_error(PROFILE + ["--kernel", str(no_entry_kernel)],
                 "empty.c does not define sdpa_forward")


@pytest.mark.parametrize("argv", [["run", "--kernel", ""], PROFILE + ["--kernel", ""]])
def test_empty_kernel_option(argv):
    # run had ignored it and run flash
    _usage_error(argv, "--kernel is empty")


def test_kernel_that_is_a_directory(tmp_path):
    _usage_error(["run", "--kernel", str(tmp_path)], f"--kernel {tmp_path} is a directory")
    _usage_error(["check", "--kernel", "/dev/null"], "--kernel /dev/null is not a regular file")
    _usage_error(["check", "--kernel", str(tmp_path)], f"--kernel {tmp_path} is a directory")


def test_bench_survives_a_kernel_that_segfaults(segfault_kernel):
    # the first (timing) call had taken the process down: exit 139, no message
    res = runner.invoke(app, ["bench", "--kernel", str(segfault_kernel), "--shape", SHAPE,
                              "--vs", "", "--rounds", "1", "--min-time", "0", "--json", "-"])
    assert res.exit_code == 1 and "Traceback" not in res.output  # reported, and not a pass
    doc = json.loads(res.stdout)
    assert doc["results"] == [] and doc["crashed"] == [f"{SHAPE}: segv.c"]
    assert any("segv.c crashed in a trial call (SIGSEGV): skipped" in n
               for n in doc["notes"])


@pytest.mark.parametrize("code", [0, 1])
def test_bench_and_profile_survive_a_kernel_that_calls_exit(tmp_path, code):
    # the trial child had counted an exit(0) in the kernel as a call it lived through,
    # and the timing call then ended probe itself: exit 0, nothing printed
    k = tmp_path / "quits.c"
    k.write_text("#include <stdlib.h>\n#include \"sdpa_probe.h\"\n"
                 f"int sdpa_forward(const sdpa_args *a) {{ (void)a; exit({code}); }}\n")
    res = runner.invoke(app, ["bench", "--kernel", str(k), "--shape", SHAPE, "--vs", "",
                              "--rounds", "1", "--min-time", "0", "--json", "-"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert doc["crashed"] == [f"{SHAPE}: quits.c"]
    assert any(f"exited (code {code}) inside the call" in n for n in doc["notes"])
    _usage_error(PROFILE + ["--kernel", str(k)], f"exited (code {code}) inside the call",
                 code=1)
    res = runner.invoke(app, ["check", "--kernel", str(k), "--repro", CASE])
    assert res.exit_code == 1 and "crash" in res.output
    assert "exit() in the kernel?" in " ".join(res.output.split())


@pytest.mark.parametrize("body,said", [
    ("if (fork() == 0) { sleep(60); _exit(0); }", "child process started"),
    ("close(1); close(2);", "its stdout (fd 1) closed; its stderr (fd 2) closed"),
])
def test_bench_and_profile_refuse_a_kernel_that_forks_or_closes_its_fds(tmp_path, body, said):
    """A forked child held the trial's output open (120 s, then "a hang"); a kernel that
    closed fd 1 took the trial's answer with it (then "exit() in the kernel?")."""
    k = tmp_path / "rude.c"
    k.write_text("#include <unistd.h>\n#include \"sdpa_probe.h\"\n"
                 f"int sdpa_forward(const sdpa_args *a) {{ (void)a; {body} return 0; }}\n")
    res = runner.invoke(app, ["bench", "--kernel", str(k), "--shape", SHAPE, "--vs", "",
                              "--rounds", "1", "--min-time", "0", "--json", "-"])
    doc = json.loads(res.stdout)
    assert doc["results"] == [] and not doc["crashed"], res.output
    assert doc["failed"] == [f"{SHAPE}: rude.c"] and res.exit_code == 1  # (had been 2)
    assert any("rude.c failed a trial call (left its process changed: " in n and said in n
               for n in doc["notes"]), doc["notes"]
    res = _usage_error(PROFILE + ["--kernel", str(k)], "attention user (rude.c) failed a trial "
                       "call: left its process changed: ", code=1)
    assert said in res.stderr


def test_profile_refuses_a_kernel_that_segfaults(segfault_kernel):
    # exit 1 (it had been 2): a problem found in the kernel, as bench and run say it
    _usage_error(PROFILE + ["--kernel", str(segfault_kernel)],
                 "attention user (segv.c) crashed in a trial call: SIGSEGV; reproduce: "
                 f"probe run --kernel {segfault_kernel} --heads 9 --kv-heads 3", code=1)


@pytest.mark.parametrize("argv,msg", [
    (["bench", "--rounds", "0"], "Invalid value for '--rounds'"),
    (["bench", "--nosuch"], "No such option: --nosuch"),
    (["nosuch"], "No such command 'nosuch'"),
    (["check", "extra-arg"], "unexpected extra argument"),
])
def test_framework_usage_errors_are_one_line(monkeypatch, capsys, argv, msg):
    """The console script's own parse errors read as the commands' errors do: one line."""
    from sdpa_probe.cli import main

    monkeypatch.setattr("sys.argv", ["probe", *argv])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith("error: ") and msg in err and len(err.strip().splitlines()) == 1


def test_bench_kernels_that_take_none_of_the_shapes_is_a_usage_error():
    """It had printed an empty table and exited 0."""
    _usage_error(["bench", "--kernel", "quant_int8", "--shape", SHAPE, "--rounds", "1"],
                 "no shape asked for (f32) is one the kernels take: quant_int8 takes i8")
