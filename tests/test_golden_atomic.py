"""`probe golden regen` is atomic: the new set is made whole beside the old one and
swapped in, so a regeneration killed at any point leaves the set exactly as it was."""

from __future__ import annotations

import os
import shutil

import pytest

from sdpa_probe.cases import suite
from sdpa_probe.golden import regen


def _ids(n: int) -> list[str]:
    cases = [c for c in suite("default") if c.family == "decode" and c.dtype == "f32"]
    return [c.id for c in cases[:n]]


def _files(root):
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


@pytest.fixture
def gset(tmp_path):
    root = tmp_path / "g"
    regen.regenerate(_ids(2), root=root)
    return root


def test_a_regeneration_killed_while_writing_leaves_the_set_as_it_was(gset, monkeypatch):
    before = _files(gset)
    calls = []

    def killed(path, data):
        calls.append(path)
        raise KeyboardInterrupt  # (as Ctrl-C, or a kill, in the middle of the writes)

    monkeypatch.setattr(regen, "_write_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        regen.regenerate(_ids(3), root=gset)  # (one case more: a file to write)
    assert calls and all(gset not in p.parents for p in calls)  # (written beside it)
    assert _files(gset) == before
    assert sorted(p.name for p in gset.parent.iterdir()) == ["g"]


def test_a_kill_between_the_renames_is_undone_by_the_next_run(gset, monkeypatch):
    before = _files(gset)
    real_rename = os.rename

    def killed_after_one(src, dst):
        real_rename(src, dst)
        raise KeyboardInterrupt  # (the old set moved aside, the new one not yet in place)

    monkeypatch.setattr(regen.os, "rename", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        regen.regenerate(_ids(3), root=gset)
    monkeypatch.setattr(regen.os, "rename", real_rename)
    assert not gset.exists()
    regen.recover_swap(gset)  # (what every later write of the set does first)
    assert _files(gset) == before


def test_folders_of_a_killed_regeneration_are_removed(gset):
    dead = gset.with_name(f".{gset.name}.new-999999999")
    shutil.copytree(gset, dead)
    regen.regenerate(_ids(3), root=gset)
    assert not dead.exists()
    assert len(_files(gset)) == len(_ids(3)) + 1  # (the cases and the manifest)
