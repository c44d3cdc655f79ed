"""Progress on stderr while something slow runs, so that a command is never silent for
minutes: a spinner line on a terminal, a plain line now and then in a pipe or a log.

BuildProgress follows a native build (the first run of the kernel library takes
minutes); with -v it prints each compiler command. Activity follows any long
computation told in words (`probe sizing`'s search and policies)."""

from __future__ import annotations

import io
import os
import shlex
import sys
import threading
import time

from rich.console import Console
from rich.text import Text

from ..build_progress import BuildWatcher

PIPE_EVERY = 15.0  # seconds between two lines in a pipe (a terminal's line is redrawn)

# what a build's module stem is, in a sentence
_WHAT = {"sdpa_probe_native": "the native kernels", "sdpa_probe_user": "your kernel",
         "sdpa_probe_user_so": "the shim to your library", "sdpa_probe_ggml": "the ggml adapter"}


def _stderr_copy():
    """A stream to stderr that stays there while a build sends file descriptor 2 into
    its log (build._redirect_fd): a duplicate of the descriptor, or sys.stderr itself
    when it is not a file (a test's capture)."""
    try:
        return open(os.dup(sys.stderr.fileno()), "w", buffering=1, closefd=True)  # noqa: SIM115
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


class Line:
    """One progress line: redrawn in place on a terminal (with its elapsed seconds
    ticking); elsewhere printed again every PIPE_EVERY seconds, changed or not (a
    compiler can run for minutes on one source), the first and last at once."""

    def __init__(self, text: str, file=None):
        self._own = file is None and _stderr_copy()
        # (soft_wrap: a line in a pipe or a log is never folded at 80 columns)
        self.console = Console(file=self._own or file or sys.stderr, highlight=False,
                               soft_wrap=True)
        self.t0 = self._last = time.monotonic()
        self.text, self.status = text, None
        self._lock, self._done = threading.Lock(), threading.Event()
        if self.console.is_terminal:
            self.status = self.console.status(self)
            self.status.start()
        else:
            self.console.print(text, markup=False)
            threading.Thread(target=self._heartbeat, daemon=True).start()

    def _heartbeat(self) -> None:
        while not self._done.wait(PIPE_EVERY):
            self.update(self.text)

    def __rich__(self) -> Text:
        return Text(f"{self.text} ({self.elapsed():.0f} s)")

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def update(self, text: str, last: bool = False) -> None:
        self.text = text
        if self.status is not None:
            self.status.update(self)
            return
        with self._lock:
            if not self._done.is_set() and (last or time.monotonic() - self._last >= PIPE_EVERY):
                self._last = time.monotonic()
                self.console.print(f"{text} ({self.elapsed():.0f} s)", markup=False)

    def above(self, text: str) -> None:
        """A line printed above the progress line (kept)."""
        self.console.print(text, markup=False, soft_wrap=True)

    def close(self, text: str | None = None) -> None:
        with self._lock:
            self._done.set()
        if self.status is not None:
            self.status.stop()
        if text:
            self.console.print(text, markup=False)
        if self._own:
            self._own.close()


class BuildProgress(BuildWatcher):
    """A native build on stderr; verbose: each compiler command too."""

    def __init__(self, verbose: bool = False, file=None):
        self.verbose, self.file = verbose, file
        self.line: Line | None = None
        self.what = ""

    def started(self, stem: str, sources: list[str]) -> None:
        self.what = _WHAT.get(stem, stem)
        self.line = Line(f"building {self.what}: {len(sources)} source(s), once (then "
                         "cached) ...", self.file)

    def command(self, argv: list[str]) -> None:
        if self.verbose and self.line is not None:
            self.line.above(shlex.join(argv))

    def compiled(self, source: str, done: int, total: int) -> None:
        if self.line is not None:
            self.line.update(f"building {self.what}: {done}/{total} compiled ({source})",
                             last=done == total)

    def linking(self, stem: str) -> None:
        if self.line is not None:
            self.line.update(f"building {self.what}: linking", last=True)

    def finished(self, stem: str, seconds: float, ok: bool) -> None:
        if self.line is not None:
            self.line.close(f"built {self.what} in {seconds:.0f} s" if ok else
                            f"building {self.what} failed after {seconds:.0f} s")
            self.line = None


class Activity:
    """Progress of a long computation told in words: each call replaces the line's text
    (`what: text`); close() ends it."""

    def __init__(self, what: str, file=None):
        self.what, self.file = what, file
        self.line: Line | None = None

    def __call__(self, text: str) -> None:
        if self.line is None:
            self.line = Line(f"{self.what}: {text}", self.file)
        else:
            self.line.update(f"{self.what}: {text}")

    def close(self) -> None:
        if self.line is not None:
            self.line.close()
            self.line = None
