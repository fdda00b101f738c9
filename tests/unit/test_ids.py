"""Push, message and batch ids: random, unique, and not shared with a forked child."""

from __future__ import annotations

import os
import re

from shared.ids import new_id


def test_ids_are_32_hex_characters_and_unique_across_pool_refills() -> None:
    ids = [new_id() for _ in range(5000)]  # about 20 refills of the pool
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_does_not_repeat_its_parents_next_ids() -> None:
    new_id()  # the pool is filled, with ids still unused in it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next ids, and leave at once
        os.write(write, ",".join(new_id() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode().split(",")
    os.close(read)
    os.waitpid(pid, 0)
    parent = [new_id() for _ in range(3)]
    assert len(child) == 3 and not set(child) & set(parent)
