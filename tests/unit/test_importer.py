"""Importing users from CSV and JSON Lines files into a real SQLite directory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from router.directory.importer import MAX_BAD_KEPT, ImportReport, import_file
from router.directory.migrate import upgrade
from router.directory.sql import SqlUserDirectory, UserRecord
from router.testing import ManualClock
from shared.errors import DirectoryUnavailable, InvalidInput


@pytest.fixture
async def directory(tmp_path: Path) -> AsyncIterator[SqlUserDirectory]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'directory.db'}"
    await upgrade(url)
    async with SqlUserDirectory.from_url(url, ManualClock()) as d:
        yield d


class Progress:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, done: int, total: int) -> None:
        self.calls.append((done, total))


async def test_csv_with_bad_lines(directory: SqlUserDirectory, tmp_path: Path) -> None:
    path = tmp_path / "users.csv"
    lines = [
        "uid,tags",  # 1
        "alice,red|blue",  # 2
        "bob, red ; green ",  # 3: either separator, spaces trimmed
        '"",red',  # 4: missing uid
        "carol,",  # 5: no tags
        "x" * 129 + ",red",  # 6: uid too long
        "dave,red|" + "t" * 65,  # 7: tag too long
        "erin",  # 8: a field short
        "",  # 9: blank, ignored
        # 10: a quoted uid over two lines, reported at its first line with the lines
        # it took (no uid or tag holds a newline: an unclosed quote, most likely)
        '"multi',
        'line",red',  # 11
        "frank,a|b|a|",  # 12: duplicate and empty tags dropped
    ]
    path.write_bytes(("\ufeff" + "\n".join(lines) + "\n").encode())
    progress = Progress()

    report = await import_file(directory, path, batch=2, progress=progress)

    assert report == ImportReport(
        imported=4,
        bad=[
            (4, "missing uid"),
            (6, "uid: must be 1-128 characters, got 129"),
            (7, "tags[1]: must be 1-64 characters, got 65"),
            (8, "expected 2 fields, got 1"),
            (
                10,
                "a quoted field runs on to line 11 (an unclosed quote?): "
                "lines 10-11 were not imported",
            ),
        ],
        skipped=5,
    )
    assert await directory.get("alice") == UserRecord("alice", ("red", "blue"))
    assert await directory.get("bob") == UserRecord("bob", ("red", "green"))
    assert await directory.get("carol") == UserRecord("carol", ())
    assert await directory.get("multi\nline") is None
    assert await directory.get("frank") == UserRecord("frank", ("a", "b"))
    assert await directory.count() == 4
    # after each batch of 2 rows (a row's first line counts as done), ending at the total
    assert progress.calls == [(3, 12), (5, 12), (7, 12), (10, 12), (12, 12)]


async def test_an_unclosed_quote_says_which_lines_it_took(
    directory: SqlUserDirectory, tmp_path: Path
) -> None:
    """Before: `imported 1 users, skipped 1 bad lines`, exit 0, and the 1000 users after
    the quote silently not imported (they were one field of the bad line)."""
    path = tmp_path / "users.csv"
    lines = ["uid,tags", "alice,a", 'carol,"vip', *(f"u{i},t" for i in range(1000))]
    path.write_text("\n".join(lines) + "\n")
    report = await import_file(directory, path)
    assert report.imported == 1
    [(line, reason)] = report.bad
    assert line == 3
    assert reason.endswith("to line 1003 (an unclosed quote?): lines 3-1003 were not imported")


async def test_jsonl_with_bad_lines(directory: SqlUserDirectory, tmp_path: Path) -> None:
    path = tmp_path / "users.ndjson"
    lines = [
        json.dumps({"uid": "u1", "tags": ["a", "b"]}),  # 1
        "{not json",  # 2
        json.dumps({"tags": ["a"]}),  # 3
        json.dumps({"uid": 5}),  # 4
        json.dumps({"uid": "u2", "tags": "a"}),  # 5
        json.dumps({"uid": "u3", "tags": [1]}),  # 6
        "[1, 2]",  # 7
        "",  # 8: blank, ignored
        json.dumps({"uid": "u4"}),  # 9: no tags
        json.dumps({"uid": "x" * 129}),  # 10
        json.dumps({"uid": "u5", "tags": [f"t{i}" for i in range(33)]}),  # 11
        json.dumps({"uid": "u6", "tags": ["ü", "中"], "extra": True}),  # 12
    ]
    path.write_text("\n".join(lines))  # no newline after the last line
    progress = Progress()

    report = await import_file(directory, path, batch=5, progress=progress)

    assert report.imported == 3
    assert [line for line, _ in report.bad] == [2, 3, 4, 5, 6, 7, 10, 11]
    reasons = dict(report.bad)
    assert reasons[2].startswith("bad JSON")
    assert reasons[3] == "missing uid"
    assert reasons[4] == "uid: must be a string"
    assert reasons[5] == "tags: must be a list of strings"
    assert reasons[6] == "tags[0]: must be a string"
    assert reasons[7] == "not a JSON object"
    assert reasons[11] == "tags: at most 32 distinct tags, got 33"
    assert await directory.page(None) == ["u1", "u4", "u6"]
    assert await directory.get("u6") == UserRecord("u6", ("ü", "中"))
    assert progress.calls[-1] == (12, 12)
    assert [done for done, _ in progress.calls] == [5, 11, 12]


async def test_batches_progress_and_reimport(directory: SqlUserDirectory, tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    with path.open("w") as f:
        for i in range(12_000):
            f.write(json.dumps({"uid": f"user{i:05d}", "tags": ["even" if i % 2 else "odd"]}))
            f.write("\n")
    progress = Progress()
    report = await import_file(directory, path, progress=progress)
    assert report == ImportReport(12_000, [], 0)
    assert progress.calls == [(5000, 12_000), (10_000, 12_000), (12_000, 12_000)]
    assert await directory.count() == 12_000
    # importing again changes nothing
    assert (await import_file(directory, path, batch=10_000)).imported == 12_000
    assert await directory.count() == 12_000
    assert len(await directory.page(None, limit=10_000, tags_any=["odd"])) == 6000


async def test_bad_bytes_cost_one_line(directory: SqlUserDirectory, tmp_path: Path) -> None:
    csv_path = tmp_path / "latin1.csv"
    csv_path.write_bytes(b"uid,tags\nok,a\nbad\xff,a\nalso-ok,b\n")
    report = await import_file(directory, csv_path)
    assert report.imported == 2
    assert report.bad == [(3, "uid: must be valid Unicode (no lone surrogates)")]
    jsonl_path = tmp_path / "latin1.jsonl"
    jsonl_path.write_bytes(b'{"uid": "j1"}\n{"uid": "\xff"}\n{"uid": "j2"}\n')
    report = await import_file(directory, jsonl_path)
    assert (report.imported, report.bad) == (2, [(2, "not valid UTF-8")])


async def test_a_file_of_garbage_keeps_a_bounded_report(
    directory: SqlUserDirectory, tmp_path: Path
) -> None:
    path = tmp_path / "garbage.jsonl"
    path.write_text("nope\n" * (MAX_BAD_KEPT + 500))
    report = await import_file(directory, path, batch=100)
    assert report.imported == 0
    assert len(report.bad) == MAX_BAD_KEPT
    assert report.skipped == MAX_BAD_KEPT + 500


async def test_empty_files(directory: SqlUserDirectory, tmp_path: Path) -> None:
    for name in ("empty.csv", "empty.jsonl"):
        (tmp_path / name).write_text("")
        progress = Progress()
        report = await import_file(directory, tmp_path / name, progress=progress)
        assert report == ImportReport(0, [], 0)
        assert progress.calls == [(0, 0)]


async def test_file_errors_name_the_file(directory: SqlUserDirectory, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"users\.txt.*unknown extension"):
        await import_file(directory, tmp_path / "users.txt")
    with pytest.raises(InvalidInput, match=r"absent\.csv.*cannot read"):
        await import_file(directory, tmp_path / "absent.csv")
    headerless = tmp_path / "headerless.csv"
    headerless.write_text("alice,red\n")
    with pytest.raises(InvalidInput, match=r"headerless\.csv.*header"):
        await import_file(directory, headerless)
    (tmp_path / "ok.csv").write_text("uid,tags\n")
    with pytest.raises(InvalidInput, match="batch"):
        await import_file(directory, tmp_path / "ok.csv", batch=0)
    assert await directory.count() == 0


async def test_a_directory_failure_mid_import_says_how_far_it_got(
    directory: SqlUserDirectory, tmp_path: Path
) -> None:
    """Before: only the database's error; 20 of 30 users written, and nothing said so."""
    path = tmp_path / "users.csv"
    path.write_text("uid,tags\n" + "".join(f"u{i:02d},t\n" for i in range(30)))
    calls = 0
    upsert = directory.upsert

    async def third_fails(users: Sequence[UserRecord]) -> int:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise DirectoryUnavailable("upserting users: OperationalError: database is locked")
        return await upsert(users)

    directory.upsert = third_fails  # type: ignore[method-assign]
    with pytest.raises(DirectoryUnavailable) as raised:
        await import_file(directory, path, batch=10)
    assert str(raised.value) == (
        "upserting users: OperationalError: database is locked; the 20 users of lines "
        "1-21 were imported, none after (an import upserts: running it again is safe)"
    )
    assert await directory.count() == 20
    calls = 2  # the next import's first write fails
    with pytest.raises(DirectoryUnavailable, match="database is locked; no user was imported"):
        await import_file(directory, path, batch=10)
