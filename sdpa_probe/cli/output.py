"""One output sink per command: data to stdout, diagnostics to stderr; --json
switches the data side to a single JSON document."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from .. import native, outputs, tables
from ..errors import ProbeError
from ..libc import flush_stdio
from ..outputs import (  # noqa: F401 -- re-exported: the commands import them from here
    _not_a_report,
    check_writable,
    dumps,
    write_text,
)


class Output:
    def __init__(self, json_mode: bool = False, fmt: str = "table", output: str | None = None,
                 force: bool = False):
        # json_mode: stdout is a document (--json -, or a --format other than table
        # without --output), so the tables are not printed
        self.json_mode = json_mode
        self.fmt, self.output, self.force = fmt, output, force
        # (recorded: --format table --output FILE writes what was shown)
        self.out = Console(highlight=False, soft_wrap=False, record=output is not None)
        self.err = Console(stderr=True, highlight=False)
        # tables fit this width (tables.console_width); a pipe with no $COLUMNS is wide
        self.width = tables.console_width(self.out, os.environ)
        if not self.out.is_terminal:
            self.out.width = self.width

    def table(self, sheet: tables.Sheet) -> None:
        """A table fitted to the console's width (tables.fit: never a cut number or id)."""
        self.print(tables.render(sheet, self.width))

    def print(self, *objs: Any, **kw) -> None:
        """Human-readable data (suppressed in JSON mode, where stdout is the document)."""
        if self.json_mode:
            return
        self.out.print(*objs, **kw)

    def note(self, msg: str) -> None:
        self.err.print(msg, markup=False, highlight=False)

    def warn(self, msg: str) -> None:
        self.err.print(f"[yellow]warning:[/] {msg}", markup=True, highlight=False)

    def warn_if_portable(self) -> None:
        """Say so when the built-in kernels run a portable build: -march=native failed
        (a compiler without it, or an error in a kernel source that only the native
        flags compile), so this CPU's vector paths are not what is being run."""
        res = native.native_lib()[2]
        if res.fallback:
            self.warn("the native kernels were built with portable flags, -march=native "
                      f"failed: {res.fallback_reason or 'no reason recorded'}")

    def emit_json(self, obj: Any) -> None:
        sys.stdout.write(dumps(obj) + "\n")
        sys.stdout.flush()

    @staticmethod
    def write_json(path: str, obj: Any) -> None:
        """Write a JSON document to a path, or to stdout for '-'."""
        outputs.write_json(path, obj)


@contextlib.contextmanager
def native_stdout_to_stderr():
    """What native code writes to file descriptor 1 (a user kernel's debug printf, a
    library's chatter) goes to stderr while a command runs: stdout is the command's
    data, with --json - one JSON document, which a stray line would break. Python's
    sys.stdout keeps the real stdout through a duplicate."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        fd = -1  # (not a file: a test's captured stdout)
    if fd != 1:
        yield
        return
    old = sys.stdout
    old.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = io.TextIOWrapper(io.FileIO(saved, "w", closefd=False), encoding=old.encoding,
                                  errors=old.errors, line_buffering=True)
    try:
        yield
    finally:
        flush_stdio()  # (to stderr: a printf without a newline is still buffered)
        sys.stdout.flush()
        sys.stdout = old
        os.dup2(saved, 1)
        os.close(saved)


def path_option(value: str | None, option: str) -> Path | None:
    """A directory option's value (None when not given). An empty one is refused, not
    read as the working directory: it is a shell variable that was not set."""
    if value is None:
        return None
    if not value.strip():
        raise ProbeError(f"{option} is empty: give a directory")
    return Path(value)


def human_bytes(n: float | None) -> str:
    """A byte count in the largest binary unit it fills: 32 MiB, 90.3 KiB, 512 B ("?":
    unknown or zero)."""
    if not n:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n:.0f} B"
