"""`probe profile` refuses bad input before any work: one line on stderr, exit 2."""

import pytest
from profile_cli import FAST, TINY, run


@pytest.mark.parametrize("args,needle", [
    (["--model", "gpt-17"], "unknown model preset"),
    (["--custom", "--layers", "2", "--hidden", "64", "--heads", "6", "--kv-heads", "4",
      "--head-dim", "16", "--ffn", "64"], "not a multiple of kv heads"),
    (["--custom", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
      "--head-dim", "15", "--ffn", "64"], "even head_dim"),
    (["--custom", "--layers", "2"], "--custom needs"),
    (TINY + ["--context", "100", "--cache-size", "64"], "larger than the cache"),
    (TINY + ["--context", "10,x"], "comma-separated integers"),
    (TINY + ["--attention", "nope"], "unknown attention"),
    (TINY + ["--cache", "i8", "--attention", "flash"], "does not read a i8 cache"),
    (TINY + ["--ab", "fused"], "two attention graphs"),
    (TINY + ["--ab", "decomposed,fused", "--attention", "fused"], "drop --attention"),
    (TINY + ["--weights", "bf16"], "--weights"),
    (["--custom", "--layers", "200", "--hidden", "16384", "--heads", "128", "--kv-heads", "8",
      "--head-dim", "128", "--ffn", "65536"], "out of memory"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    res = run(*args, "--no-roofline")
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert needle in err and len(err.splitlines()) == 1 and err.startswith("error:")


@pytest.mark.parametrize("text,needle", [
    ("10:5:1", "STOP is below START"), ("0:10:0", "STEP must be positive"),
    ("1:2", "START:STOP:STEP"), ("0:100000:1", "more than 256"), (",", "empty"),
])
def test_context_range_errors(text, needle):
    res = run(*TINY, "--no-roofline", "--context", text)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert needle in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (["--context", "10", "--chart", "c.svg"], "two or more contexts"),
    (["--context", "10,20", "--chart", "c.png"], "give a .svg path"),
    (["--context", "10,20", "--chart-by", "layer"], "--chart-by"),
    (["--kernel", "nope.c"], "kernel file not found"),
    (["--kernel", "k.txt"], ".c, .cpp or .so"),
    (["--attention", "user"], "--kernel PATH"),
    (["--attention", "fused@"], "no compiler flags after @"),
    (["--interactive"], "needs a terminal on stdin"),
    (["--interactive", "--script", "--ab", "decomposed,fused"], "drop --ab"),
    (["--script"], "only goes with --interactive"),
])
def test_more_bad_input(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.txt").write_text("")
    res = run(*TINY, *FAST, *args)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert needle in err and len(err.splitlines()) == 1 and err.startswith("error:")
