"""`imroute keys migrate --uids FILE`: the file's uids, a bad one named by its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.cli.keys import read_uids
from shared.errors import InvalidUid


def test_uids_one_per_line_blank_lines_skipped(tmp_path: Path) -> None:
    path = tmp_path / "uids.txt"
    path.write_text("bob{corp}\r\n\n a b \nlast")
    assert read_uids(path) == ["bob{corp}", " a b ", "last"]


def test_a_bad_uid_is_named_by_its_line_never_quoted(tmp_path: Path) -> None:
    path = tmp_path / "uids.txt"
    path.write_text("ok\nsecret\x1b[2J\n")
    with pytest.raises(InvalidUid) as info:
        read_uids(path)
    assert info.value.field == f"--uids {path}:2"
    assert "secret" not in str(info.value) and "\x1b" not in str(info.value)
