"""The position stores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from imroute_client.store import FilePosStore, MemoryPosStore, PosStore


async def test_memory_store_keeps_the_last_position() -> None:
    store = MemoryPosStore()
    assert isinstance(store, PosStore)
    assert await store.load() is None
    await store.save("p1")
    await store.save("p2")
    assert await store.load() == "p2"


@pytest.mark.parametrize("fsync", [False, True])
async def test_file_store_survives_a_new_instance_and_leaves_no_temp_files(
    tmp_path: Path, fsync: bool
) -> None:
    path = tmp_path / "pos"
    store = FilePosStore(path, fsync=fsync)
    assert isinstance(store, PosStore)
    assert await store.load() is None
    await store.save("a-1")
    await store.save("b-2")
    assert await FilePosStore(path).load() == "b-2"
    assert os.listdir(tmp_path) == ["pos"]


async def test_file_store_writes_by_rename_and_reads_an_empty_file_as_none(
    tmp_path: Path,
) -> None:
    path = tmp_path / "pos"
    path.write_text("old")
    inode = path.stat().st_ino
    await FilePosStore(path).save("new")
    assert path.read_text() == "new"
    assert path.stat().st_ino != inode  # a new file took the old one's name: atomic
    path.write_text("  \n")
    assert await FilePosStore(path).load() is None


async def test_a_failed_write_raises_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "pos"
    path.mkdir()  # os.replace cannot put a file over a folder
    with pytest.raises(OSError):
        await FilePosStore(path).save("new")
    assert os.listdir(tmp_path) == ["pos"]
