"""Bulk import of users from CSV or JSON Lines into a UserDirectory, one batch at a time.

CSV: a header naming `uid` and `tags` columns; tags are separated by `|` or `;`.
JSON Lines (.jsonl, .ndjson): one `{"uid": "...", "tags": ["..."]}` object per line.
Bad lines are reported with their line number and skipped; the rest are imported.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import csv
import json
import re
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from router.directory.base import MAX_UPSERT, UserDirectory, UserRecord
from shared.errors import DirectoryUnavailable, InvalidInput

__all__ = ["MAX_BAD_KEPT", "ImportReport", "import_file"]

# A file of garbage must not grow memory: past this many, bad lines are only counted.
MAX_BAD_KEPT = 1000

_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_TAG_SEPARATOR = re.compile(r"[|;]")

# (line number, the record or why the line is bad)
_Row = tuple[int, UserRecord | str]


@dataclass(frozen=True, slots=True)
class ImportReport:
    """How many users were imported, and the bad lines skipped as (line number, reason).

    `bad` keeps the first MAX_BAD_KEPT bad lines; `skipped` counts them all.
    """

    imported: int
    bad: list[tuple[int, str]] = field(default_factory=list)
    skipped: int = 0


@dataclass(slots=True)
class _Chunk:
    records: list[UserRecord]
    bad: list[tuple[int, str]]
    line: int  # the last line read


async def import_file(
    directory: UserDirectory,
    path: str | Path,
    *,
    batch: int = 5000,
    progress: Callable[[int, int], None] | None = None,
) -> ImportReport:
    """Upsert the users of a .csv, .jsonl or .ndjson file in batches of `batch` lines.

    `progress(done_lines, total_lines)` is called after each batch. The file is read in
    a worker thread, one batch at a time, so neither the event loop nor memory carries
    more than a batch.
    """
    path = Path(path)
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise InvalidInput(
            "file", f"{path}: unknown extension {path.suffix!r}; use .csv, .jsonl or .ndjson"
        )
    if not 1 <= batch <= MAX_UPSERT:
        raise InvalidInput("batch", f"must be 1-{MAX_UPSERT}, got {batch}")
    with _read_errors(path):
        total = await asyncio.to_thread(_count_lines, path)
    chunks = _chunks(path, kind, batch)
    imported, skipped = 0, 0
    bad: list[tuple[int, str]] = []
    reported: tuple[int, int] | None = None
    written_to = 0  # the last line of the last chunk written
    try:
        while True:
            with _read_errors(path):
                chunk = await asyncio.to_thread(next, chunks, None)
            if chunk is None:
                break
            try:
                imported += await directory.upsert(chunk.records)
            except DirectoryUnavailable as exc:
                done = (
                    f"the {imported} users of lines 1-{written_to} were imported, none after"
                    if written_to
                    else "no user was imported"
                )
                raise DirectoryUnavailable(
                    f"{exc}; {done} (an import upserts: running it again is safe)"
                ) from exc
            written_to = chunk.line
            skipped += len(chunk.bad)
            bad.extend(chunk.bad[: MAX_BAD_KEPT - len(bad)])
            total = max(total, chunk.line)  # the file grew while being read
            if progress is not None and reported != (chunk.line, total):
                reported = (chunk.line, total)
                progress(chunk.line, total)
    finally:
        # Closes the file. Raises ValueError only when a cancelled read is still running
        # in its thread; the file is then closed when that read ends and is collected.
        with contextlib.suppress(ValueError):
            chunks.close()
    if progress is not None and reported != (total, total):
        progress(total, total)
    return ImportReport(imported, bad, skipped)


@contextlib.contextmanager
def _read_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise InvalidInput("file", f"{path}: cannot read: {exc.strerror or exc}") from exc


def _count_lines(path: Path) -> int:
    lines, last = 0, b"\n"
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")  # a last line without a newline


def _chunks(path: Path, kind: str, batch: int) -> Generator[_Chunk, None, None]:
    """The file's rows in chunks of at most `batch` lines (good and bad together)."""
    rows = _csv_rows(path) if kind == "csv" else _jsonl_rows(path)
    chunk = _Chunk([], [], 0)
    for line, row in rows:
        if isinstance(row, str):
            chunk.bad.append((line, row))
        else:
            chunk.records.append(row)
        chunk.line = line
        if len(chunk.records) + len(chunk.bad) >= batch:
            yield chunk
            chunk = _Chunk([], [], line)
    if chunk.records or chunk.bad:
        yield chunk


def _swallowed(start: int, end: int) -> str:
    """`` to line 9 (an unclosed quote?): lines 3-9 were not imported`` when a row ran
    over lines; else nothing."""
    if end <= start:
        return ""
    return f" to line {end} (an unclosed quote?): lines {start}-{end} were not imported"


def _record(uid: object, tags: object) -> UserRecord | str:
    if uid == "":
        return "missing uid"
    try:
        return UserRecord.parse(uid, tags)
    except InvalidInput as exc:
        return str(exc)


def _csv_rows(path: Path) -> Iterator[_Row]:
    # surrogateescape: bytes that are not UTF-8 become lone surrogates, which
    # UserRecord.parse refuses, so they cost one bad line rather than the whole file.
    with path.open(encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
        # strict: a quote left open to the end of the file is an error, not a field
        reader = csv.reader(f, strict=True)
        try:
            header = next(reader)
        except StopIteration:
            return
        names = [name.strip().lower() for name in header]
        if "uid" not in names:
            # Named by its line, not quoted: the file is untrusted and the message goes
            # to a terminal.
            raise InvalidInput(
                "file", f"{path}:1: the CSV header must name a uid column (uid,tags)"
            )
        uid_at = names.index("uid")
        tags_at = names.index("tags") if "tags" in names else None
        while True:
            start = reader.line_num + 1  # a quoted field may span lines: report the first
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield start, f"bad CSV: {exc}{_swallowed(start, reader.line_num)}"
                continue
            if not fields:
                continue  # a blank line
            if reader.line_num > start:
                # A quoted field over several lines: no uid or tag holds a line break, so
                # it is a quote left open, which took the lines after it with it.
                yield start, f"a quoted field runs on{_swallowed(start, reader.line_num)}"
                continue
            if len(fields) != len(names):
                yield start, f"expected {len(names)} fields, got {len(fields)}"
                continue
            tags = [] if tags_at is None else _split_tags(fields[tags_at])
            yield start, _record(fields[uid_at].strip(), tags)


def _split_tags(cell: str) -> list[str]:
    return [tag for piece in _TAG_SEPARATOR.split(cell) if (tag := piece.strip())]


def _jsonl_rows(path: Path) -> Iterator[_Row]:
    with path.open("rb") as f:
        for line, raw in enumerate(f, 1):
            data = raw.removeprefix(codecs.BOM_UTF8) if line == 1 else raw
            if not data.strip():
                continue
            try:
                obj = json.loads(data.decode("utf-8"))
            except UnicodeDecodeError:
                yield line, "not valid UTF-8"
                continue
            except (ValueError, RecursionError) as exc:
                yield line, f"bad JSON: {getattr(exc, 'msg', exc)}"
                continue
            if not isinstance(obj, dict):
                yield line, "not a JSON object"
            elif "uid" not in obj:
                yield line, "missing uid"
            else:
                yield line, _record(obj["uid"], obj.get("tags", []))
