"""Client frames read without the library (`socket_gateway.ws.frames`): which reads it
takes, and where the frame boundaries fall however the reads cut the stream."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from socket_gateway.ws.frames import SMALL_MAX, FrameEnds, small_texts


def client_frame(opcode: Opcode, data: bytes, fin: bool = True, mask: bool = True) -> bytes:
    """A frame as a client sends it (masked), serialized by the library itself."""
    frame = Frame(opcode, data, fin)
    if mask:
        return frame.serialize(mask=True)
    return frame.serialize(mask=False)


def parsed(data: bytes) -> list[Frame]:
    """The library's own reading of `data` (as the server side does: masked frames)."""
    reader = StreamReader()
    reader.feed_data(data)
    frames = []
    while reader.buffer:
        parser = Frame.parse(reader.read_exact, mask=True, max_size=None)
        try:
            next(parser)
        except StopIteration as done:
            frames.append(done.value)
    return frames


ACK = b'{"type":"ack","pos":"2~3.1796021395421~0.0~0.0~g1~0.0"}'


def test_whole_small_text_frames_are_read_as_the_library_reads_them() -> None:
    texts = [ACK, b"", "é✓".encode(), b"x" * SMALL_MAX]
    data = b"".join(client_frame(Opcode.TEXT, t) for t in texts)
    assert small_texts(data) == texts == [f.data for f in parsed(data)]


CASES = {
    "unmasked": client_frame(Opcode.TEXT, ACK, mask=False),  # the library closes: 1002
    "ping": client_frame(Opcode.PING, b"p"),  # the library answers it
    "close": client_frame(Opcode.CLOSE, b"\x03\xe8"),
    "binary": client_frame(Opcode.BINARY, b"b"),
    "fragment": client_frame(Opcode.TEXT, b"part", fin=False),
    "long": client_frame(Opcode.TEXT, b"x" * (SMALL_MAX + 1)),
    "bad utf-8": client_frame(Opcode.TEXT, b"\xff\xfe"),  # the library closes: 1007
    "cut short": client_frame(Opcode.TEXT, ACK)[:-1],
    "then a ping": client_frame(Opcode.TEXT, ACK) + client_frame(Opcode.PING, b""),
    "rsv1": bytes([0xC1]) + client_frame(Opcode.TEXT, ACK)[1:],  # no extension here
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_anything_else_is_left_to_the_library(case: str) -> None:
    assert small_texts(CASES[case]) is None


frames = st.lists(
    st.tuples(
        st.sampled_from([Opcode.TEXT, Opcode.BINARY, Opcode.PING]),
        st.sampled_from([0, 1, 5, 125, 126, 127, 200, 65_535, 65_536, 70_000]),
    ),
    min_size=1,
    max_size=8,
)


@given(frames, st.lists(st.integers(min_value=1, max_value=70_000), max_size=12))
def test_frame_ends_follow_the_boundaries_however_the_reads_cut(
    spec: list[tuple[Opcode, int]], cuts: list[int]
) -> None:
    stream = b""
    ends = set()
    for opcode, size in spec:
        data = os.urandom(size) if opcode is Opcode.BINARY else b"p" * min(size, 125)
        stream += client_frame(opcode, data)
        ends.add(len(stream))
    tracker = FrameEnds()
    at = 0
    for cut in [*sorted(set(cuts)), len(stream)]:
        if cut <= at or cut > len(stream):
            continue
        tracker.feed(stream[at:cut])
        at = cut
        assert tracker.at_boundary == (at in ends), (at, sorted(ends))
