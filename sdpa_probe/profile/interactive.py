"""`probe profile --interactive`: a prompt loop over the profile settings. Each line
changes settings and reruns; every table after the first has a column of the change
against the previous run. What was explored can be saved as JSON."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from .. import TOOL
from ..errors import ProbeError
from ..outputs import check_writable, dumps
from ..tables import Col, Sheet
from . import decode, models, report
from .attention import resolve_attention
from .run import run_profile
from .settings import Settings, parse_contexts, validate

HELP = """commands (one per line; several settings may share a line, then the profile reruns):
  model NAME          a preset: {presets}
  context N           cached tokens: N, a list 100,1000,2000 or a range 500:4000:500
  attention A         decomposed, fused, a registered kernel, or user (with --kernel)
  cache f32|f16|i8    KV cache dtype
  threads N           threads (0: all cores)
  weights f32|f16     weight dtype
  steps N             timed steps per run
  run  (or an empty line)   rerun with the current settings
  show                the current settings
  history             one line per run so far
  save PATH           write every run so far as JSON
  help                this text
  quit  (or q, exit, end of input)"""

KEYS = ("model", "context", "attention", "cache", "threads", "weights", "steps")
ALIASES = {"ctx": "context", "c": "context", "m": "model", "a": "attention", "kv": "cache",
           "t": "threads", "n": "steps", "dtype": "cache"}
QUIT = {"quit", "q", "exit", ":q"}


def prompt_words() -> list[str]:
    """What Tab completes at the prompt: the commands, the settings and their named
    values."""
    return [*KEYS, "run", "show", "history", "save", "help", "quit", *models.PRESETS,
            "decomposed", "fused", "user", *decode.WEIGHT_DTYPES, *decode.CACHE_DTYPES]


def settings_view(s: Settings) -> dict:
    return {"model": s.shape.name, "context": ",".join(str(c) for c in s.contexts),
            "attention": s.attention[0], "cache": s.cache, "threads": s.threads,
            "weights": s.weights, "steps": s.steps}


def _int(key: str, value: str, lo: int) -> int:
    try:
        v = int(value)
    except ValueError:
        raise ProbeError(f"{key} wants an integer, got {value!r}") from None
    if v < lo:
        raise ProbeError(f"{key} must be >= {lo}")
    return v


def apply(s: Settings, pairs: list[tuple[str, str]]) -> Settings:
    """A new Settings with the changes; raises ProbeError (nothing changed) on bad input."""
    new = dataclasses.replace(s)
    for key, value in pairs:
        key = ALIASES.get(key, key)
        if key == "model":
            new.shape = models.resolve(value, False, {}, None)
        elif key == "context":
            new.contexts = parse_contexts(value)
        elif key == "attention":
            new.attention = (value,)
        elif key == "cache":
            new.cache = value
        elif key == "threads":
            new.threads = _int(key, value, 0)
        elif key == "weights":
            new.weights = value
        elif key == "steps":
            new.steps = _int(key, value, 1)
        else:
            raise ProbeError(f"unknown setting {key!r} (type help)")
    validate(new)
    for label in new.attention:
        resolve_attention(label, new.cache, new.kernel_path)
    return new


def parse_line(line: str) -> list[tuple[str, str]]:
    """'context 2000 attention decomposed' or 'context=2000, attention=decomposed'."""
    words = line.replace("=", " ").split()
    if len(words) % 2:
        raise ProbeError(f"{line.strip()!r}: settings come in pairs, e.g. context 2000 "
                         "(type help)")
    return [(words[i].lower(), words[i + 1].rstrip(",")) for i in range(0, len(words), 2)]


def primary(doc: dict) -> dict:
    return next(sm for sm in doc["runs"]
                if sm["attention"] == doc["graph"] and sm["context"] == doc["context"])


class Explorer:
    """The loop. read(prompt) returns a line or raises EOFError."""

    def __init__(self, settings: Settings, out, read: Callable[[str], str],
                 json_path: str | None = None):
        self.s, self.out, self.read, self.json_path = settings, out, read, json_path
        self.history: list[dict] = []

    # ---- running -------------------------------------------------------------

    def run_once(self, changed: dict) -> bool:
        """One run with the current settings, shown; False (and the error said) if it
        did not run."""
        try:
            doc, _ = run_profile(self.s, progress=self.out.note)
        except ProbeError as exc:
            self.out.err.print(f"error: {exc}", markup=False, highlight=False)
            return False
        except KeyboardInterrupt:
            self.out.err.print("interrupted: run dropped", markup=False)
            return False
        sm = primary(doc)
        prev = self.history[-1] if self.history else None
        n = len(self.history) + 1
        prev_sm = primary(prev["result"]) if prev else None
        self.out.table(report.op_table(doc, sm, prev_sm, f"#{n - 1}" if prev else "prev"))
        for line in report.summary_lines(sm):
            self.out.print(line)
        if "growth" in doc:
            for label in doc["growth"]:
                self.out.table(report.growth_table(doc, label))
        step = sm["step_ms"]["median"]
        entry = {"run": n, "settings": settings_view(self.s), "changed": changed,
                 "step_ms": step, "tokens_per_s": sm["tokens_per_s"],
                 "delta_step_ms": None, "result": doc}
        line = f"run #{n}: step {step:.3f} ms ({sm['tokens_per_s']:.2f} tokens/s)"
        if prev_sm is not None:
            before = prev_sm["step_ms"]["median"]
            entry["delta_step_ms"] = step - before
            what = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in changed.items()) or "rerun"
            line += (f"; vs #{n - 1}: {step - before:+.3f} ms "
                     f"({100 * (step - before) / before:+.1f}%) after {what}")
        self.out.print(line)
        self.out.print("")
        self.history.append(entry)
        return True

    # ---- commands ------------------------------------------------------------

    def show(self) -> None:
        self.out.print("settings: " + ", ".join(f"{k} {v}"
                                                  for k, v in settings_view(self.s).items()))

    def history_table(self) -> Sheet:
        t = Sheet([Col("#"), Col("model", "id"), Col("context", "id"), Col("attention", "id"),
                   Col("cache", "id"), Col("threads"), Col("step ms"), Col("Δ ms"),
                   Col("tokens/s")], title="runs so far")
        for e in self.history:
            v = e["settings"]
            d = e["delta_step_ms"]
            t.add_row(str(e["run"]), v["model"], v["context"], v["attention"], v["cache"],
                      str(e["result"]["threads"]), f"{e['step_ms']:.3f}",
                      "" if d is None else f"{d:+.3f}", f"{e['tokens_per_s']:.2f}")
        return t

    def document(self) -> dict:
        return {"tool": dict(TOOL), "interactive": True, "runs": self.history}

    def save(self, path: str) -> None:
        check_writable(path, "the session to")  # (an earlier save of it is a report: overwritten)
        try:
            Path(path).expanduser().write_text(dumps(self.document()) + "\n")
        except OSError as exc:
            raise ProbeError(f"cannot write {path}: {exc.strerror}") from None
        self.out.note(f"saved {len(self.history)} run(s) to {path}")

    def handle(self, line: str) -> bool:
        """One input line; False to stop."""
        text = line.strip()
        word = text.split()[0].lower() if text else ""
        if word in QUIT:
            return False
        if word in ("help", "?", "h"):
            self.out.print(HELP.format(presets=", ".join(models.PRESETS)), markup=False)
        elif word == "show":
            self.show()
        elif word == "history":
            self.out.table(self.history_table())
        elif word == "save":
            parts = text.split(maxsplit=1)
            if len(parts) < 2:
                raise ProbeError("save wants a path, e.g. save explore.json")
            self.save(parts[1])
        elif word in ("", "run", "r"):
            self.run_once({})
        else:
            pairs = parse_line(text)
            new = apply(self.s, pairs)
            before, after = settings_view(self.s), settings_view(new)
            changed = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
            kept, self.s = self.s, new
            if not self.run_once(changed) and self.history:
                # a change that cannot run (out of memory, a kernel that crashed) is not
                # the base of the next command, which would fail the same way
                self.s = kept
                self.out.note("settings kept as they were: " + ", ".join(
                    f"{k} {v}" for k, v in settings_view(kept).items()))
        return True

    def loop(self) -> None:
        self.out.print("probe profile --interactive: change a setting and the profile reruns "
                       "(e.g. 'context 2000', 'attention decomposed threads 1'); 'help' lists "
                       "the commands, 'quit' ends.", markup=False)
        self.show()
        self.run_once({})
        while True:
            try:
                line = self.read("profile> ")
            except (EOFError, KeyboardInterrupt):
                self.out.print("")
                break
            try:
                if not self.handle(line):
                    break
            except ProbeError as exc:
                self.out.err.print(f"error: {exc}", markup=False, highlight=False)
        if self.history:
            self.out.table(self.history_table())
        if self.json_path:
            self.save(self.json_path)


def explore(settings: Settings, out, read: Callable[[str], str],
            json_path: str | None = None) -> list[dict]:
    ex = Explorer(settings, out, read, json_path)
    ex.loop()
    return ex.history

