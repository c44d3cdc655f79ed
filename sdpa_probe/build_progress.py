"""What a native build tells whoever watches it: which module, each compiler command,
each source compiled, the link, the end. A first build of the kernel library takes
minutes; the command line shows it (cli/progress.py), a library caller sees nothing.

The watcher is process-wide (a build can start deep inside any command); `watching`
installs one for a block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class BuildWatcher:
    """Told of every step of a build; this one ignores them all."""

    def started(self, stem: str, sources: list[str]) -> None:
        """A build of the module named `stem` (BuildSpec.stem) from these sources begins."""

    def command(self, argv: list[str]) -> None:
        """A compiler command about to run."""

    def compiled(self, source: str, done: int, total: int) -> None:
        """One source compiled: `done` of `total`."""

    def linking(self, stem: str) -> None:
        """The objects are compiled; the module is being linked."""

    def finished(self, stem: str, seconds: float, ok: bool) -> None:
        """The build ended, built or failed."""


_watcher: BuildWatcher = BuildWatcher()


def watcher() -> BuildWatcher:
    return _watcher


@contextlib.contextmanager
def watching(w: BuildWatcher) -> Iterator[BuildWatcher]:
    global _watcher
    saved, _watcher = _watcher, w
    try:
        yield w
    finally:
        _watcher = saved
