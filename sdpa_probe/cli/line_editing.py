"""Line editing at an interactive prompt (`probe profile --interactive` on a terminal):
readline's arrows, Ctrl-R and Tab completion of the prompt's words, and the history
kept across runs in $SDPA_PROBE_HISTORY (default: profile-history in the cache folder).
Without a readline module (a Python built without one) the prompt reads plain lines."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from ..build_cache import cache_root

HISTORY_LENGTH = 1000


def history_path() -> Path:
    env = os.environ.get("SDPA_PROBE_HISTORY")
    return Path(env).expanduser() if env else cache_root() / "profile-history"


def completer(words: list[str]) -> Callable[[str, int], str | None]:
    """readline's completer: the state-th word that starts with the text typed."""
    known = sorted(set(words))

    def complete(text: str, state: int) -> str | None:
        matches = [w for w in known if w.startswith(text)]
        return matches[state] if state < len(matches) else None

    return complete


@contextlib.contextmanager
def line_editing(words: list[str], history: Path | None = None) -> Iterator[bool]:
    """readline for input() inside the block, its history read from and written back to
    `history`; yields False (plain input) where there is no readline."""
    try:
        import readline  # deferred: only a prompt on a terminal wants it; it may be absent
    except ImportError:
        yield False
        return
    history = history or history_path()
    saved = readline.get_completer()
    readline.set_completer(completer(words))
    readline.set_completer_delims(" \t=,")
    # libedit (macOS's readline) spells the binding its own way
    libedit = "libedit" in (readline.__doc__ or "")
    readline.parse_and_bind("bind ^I rl_complete" if libedit else "tab: complete")
    readline.set_history_length(HISTORY_LENGTH)
    with contextlib.suppress(OSError):  # (none yet, or unreadable: a fresh history)
        readline.read_history_file(history)
    try:
        yield True
    finally:
        readline.set_completer(saved)
        with contextlib.suppress(OSError):  # (a read-only home: the history is not kept)
            history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history)
