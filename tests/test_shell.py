"""Shell habits: completion of commands and options, and line editing with a kept
history at `probe profile --interactive`'s prompt."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from sdpa_probe.cli.line_editing import completer, line_editing

PROBE = Path(sys.executable).with_name("probe")  # (the console script beside this Python)


def _complete(words: str, tmp_path: Path) -> list[str]:
    """What bash's completion function (probe --install-completion) gets for `words`."""
    env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1),
           "_PROBE_COMPLETE": "complete_bash", "HOME": str(tmp_path)}
    r = subprocess.run([str(PROBE)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.skipif(not PROBE.exists(), reason="no probe console script beside this Python")
def test_completion_names_commands_and_options(tmp_path):
    assert _complete("probe che", tmp_path) == ["check"]
    assert _complete("probe check --su", tmp_path) == ["--suite"]
    assert "--install-completion" in _complete("probe --inst", tmp_path)


def test_the_completer_offers_the_words_that_fit():
    complete = completer(["context", "cache", "run", "cache"])
    assert [complete("c", i) for i in range(3)] == ["cache", "context", None]
    assert complete("x", 0) is None


def test_the_history_is_kept_across_prompts(tmp_path):
    readline = pytest.importorskip("readline")
    history = tmp_path / "state" / "profile-history"
    with line_editing(["context"], history) as editing:
        assert editing
        readline.add_history("context 2000")
    assert history.read_text().splitlines()[-1] == "context 2000"
    readline.clear_history()
    with line_editing(["context"], history):
        n = readline.get_current_history_length()
        assert readline.get_history_item(n) == "context 2000"


# In a terminal: a line, then Up + Enter (the same line again), then Tab completion.
_PROMPT = """
import sys
from pathlib import Path
from sdpa_probe.cli.line_editing import line_editing
with line_editing(["context", "cache"], Path(sys.argv[1])):
    print(repr([input("profile> ") for _ in range(3)]), flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="a pseudo-terminal as Linux gives one")
def test_the_prompt_edits_lines_in_a_terminal(tmp_path):
    pytest.importorskip("readline")
    main, sub = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", _PROMPT, str(tmp_path / "h")], stdin=sub,
                            stdout=sub, stderr=subprocess.PIPE, env={**os.environ,
                                                                      "TERM": "xterm"})
    os.close(sub)
    try:
        for keys in (b"context 2000\r", b"\x1b[A\r", b"cont\t 500\r"):
            os.write(main, keys)
        seen = b""
        while b"]" not in seen:
            ready, _, _ = select.select([main], [], [], 30)
            assert ready, f"no answer from the prompt; so far: {seen!r}"
            seen += os.read(main, 4096)
    finally:
        proc.wait(timeout=30)
        os.close(main)
    assert "['context 2000', 'context 2000', 'context 500']" in seen.decode(errors="replace")
