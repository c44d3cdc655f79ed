"""`probe profile --interactive`: a prompt loop that reruns on every change and shows
the change against the previous run."""

import json

from profile_cli import FAST, TINY, cli

from sdpa_probe.cli import app


def test_interactive_session_with_deltas_and_save(tmp_path):
    saved, final = tmp_path / "explored.json", tmp_path / "final.json"
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's notes")
    commands = "\n".join([
        "context 30",                         # run 2: the context changes
        "attention=decomposed, cache=f32",    # run 3: two settings on one line
        "bogus 1",                            # an error, and the loop goes on
        "model",                              # an odd number of words
        "threads 0",                          # run 4
        "",                                   # run 5: rerun as is
        f"save {saved}",
        f"save {notes}",                      # refused: not a report; the loop goes on
        "history",
        "quit",
        "context 99",                         # never read
    ]) + "\n"
    res = cli.invoke(app, ["profile", *TINY, *FAST, "--context", "20", "--interactive",
                           "--script", "--json", str(final)], input=commands)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert out.count("sum of ops") == 5
    for n in (1, 2, 3, 4):
        assert f"Δ ms vs #{n}" in out
    assert "new" in out  # decomposed ops the fused run did not have
    assert "after context 20 -> 30" in out and "attention fused -> decomposed" in out
    assert "runs so far" in out
    assert "error: unknown setting 'bogus'" in res.stderr
    assert "settings come in pairs" in res.stderr
    said = "".join(res.stderr.split())  # (wrapped to the terminal, paths too)
    assert "".join(f"cannot write the session to {notes}: it exists and is not one of "
                   "probe's reports".split()) in said
    assert notes.read_text() == "the user's notes"
    doc = json.loads(saved.read_text())
    assert doc["interactive"] is True and len(doc["runs"]) == 5
    r = doc["runs"]
    assert r[0]["changed"] == {} and r[0]["delta_step_ms"] is None
    assert r[1]["changed"] == {"context": ["20", "30"]} and r[1]["settings"]["context"] == "30"
    assert r[2]["changed"] == {"attention": ["fused", "decomposed"], "cache": ["f16", "f32"]}
    assert r[3]["settings"]["threads"] == 0 and r[4]["changed"] == {}
    assert all(isinstance(x["delta_step_ms"], float) for x in r[1:])
    assert r[2]["result"]["graph"] == "decomposed" and r[2]["result"]["cache"] == "f32"
    assert len(json.loads(final.read_text())["runs"]) == 5  # --json: written at the end


def test_interactive_ends_at_end_of_input():
    res = cli.invoke(app, ["profile", *TINY, *FAST, "--context", "9", "-i", "--script"],
                     input="attention nope\n")
    assert res.exit_code == 0, res.output
    assert res.stdout.count("sum of ops") == 1 and "unknown attention 'nope'" in res.stderr


def test_a_change_that_cannot_run_is_not_kept(monkeypatch):
    """An out-of-memory context had stayed in the settings: every later command (a
    rerun, another setting) failed with the same out-of-memory error."""
    import sdpa_probe.profile.run as profile_run

    monkeypatch.setattr(profile_run, "mem_available", lambda: 64 << 20)  # (the tiny model fits)
    res = cli.invoke(app, ["profile", *TINY, *FAST, "--context", "20", "-i", "--script"],
                     input="context 10000000\nsteps 2\n\n")
    assert res.exit_code == 0, res.output
    assert res.stderr.count("out of memory") == 1, res.stderr
    assert "settings kept as they were: model custom, context 20," in " ".join(res.stderr.split())
    assert res.stdout.count("sum of ops") == 3      # the first run, steps 2, the rerun
    assert "after steps 3 -> 2" in res.stdout       # against the run before, not the failed one
