"""The worker end of the model server's frame protocol (src/modelserver/README.md, "Worker
protocol"; frame.h is the C++ end):

    u32 BE rest_length | u8 type | u32 BE meta_length | meta (JSON object) | payload (raw bytes)

Standard library only. Each frame is read into one buffer sized to it (nothing kept between
frames) and each answer leaves in one sendall.
"""

import json
import struct

READY, LOAD_FAILED, INVOKE, RESULT = 1, 2, 3, 4
MAX_FRAME_BYTES = 1 << 30  # kMaxFrameBytes of frame.h

_HEAD = struct.Struct(">IBI")  # rest_length, type, meta_length
_dumps = json.JSONEncoder(separators=(",", ":")).encode
_loads = json.loads


class ProtocolError(Exception):
    """The peer broke the protocol (oversized or malformed frame, EOF inside a frame)."""


class FrameReader:
    """Reads frames from a blocking stream socket."""

    def __init__(self, sock):
        self._recv_into = sock.recv_into
        self._head = bytearray(_HEAD.size)
        self._head_view = memoryview(self._head)

    def _fill(self, view):
        """Fills view completely; returns the number of bytes read before EOF (len(view) when
        complete)."""
        got, want = 0, len(view)
        recv_into = self._recv_into
        while got < want:
            n = recv_into(view[got:])
            if n == 0:
                return got
            got += n
        return got

    def read(self, on_head=None):
        """The next frame as (type, meta dict, payload memoryview), or None at EOF between frames.
        on_head() runs once the frame's head has arrived (the worker marks itself busy there, so a
        SIGTERM from then on waits for the answer)."""
        got = self._fill(self._head_view)
        if got == 0:
            return None
        if got < _HEAD.size:
            raise ProtocolError("EOF inside a frame head (%d of %d bytes)" % (got, _HEAD.size))
        rest, ftype, meta_len = _HEAD.unpack(self._head)
        if rest > MAX_FRAME_BYTES or rest < 5 or meta_len > rest - 5:
            raise ProtocolError("bad frame head: rest_length %d, meta_length %d" % (rest, meta_len))
        if on_head is not None:
            on_head()
        body = bytearray(rest - 5)
        view = memoryview(body)
        if self._fill(view) < len(body):
            raise ProtocolError("EOF inside a frame of %d bytes" % rest)
        try:
            meta = _loads(body[:meta_len]) if meta_len else {}
        except ValueError as e:
            raise ProtocolError("frame meta is not JSON: %s" % e)
        if not isinstance(meta, dict):
            raise ProtocolError("frame meta is not a JSON object")
        return ftype, meta, view[meta_len:]


def encode_frame(ftype, meta, parts=()):
    """The frame as one bytes object: head, meta, then the payload parts concatenated."""
    m = _dumps(meta).encode()
    size = 0
    for p in parts:
        size += len(p)
    head = _HEAD.pack(5 + len(m) + size, ftype, len(m))
    if not parts:
        return head + m
    return b"".join((head, m, *parts))
