"""Many small envelopes in one ZMQ message.

A check-in wave is tens of thousands of deliveries without payload frames at one instant, and as
many answers. Sent one ZMQ message each, the socket calls cost the network process about as much as
what it does with the messages. Envelopes without payload frames that one side sends the same peer
in a row go as one `batch` envelope (`parts`: the packed envelopes, in order); the receiver handles
each part as if it had come alone, in that order. A message with payload frames first sends what is
queued for its peer, so nothing overtakes anything: batching changes how many ZMQ messages cross,
never what crosses or in which order."""
from __future__ import annotations

from typing import Any, Callable

import zmq

from . import envelope

MAX_PARTS = 512  # envelopes in one batch
MAX_BYTES = 256 << 10  # and their bytes (one larger envelope goes alone): far under envelope.MAX_ENVELOPE_BYTES


def pack_batch(parts: list[bytes]) -> bytes:
    return envelope.pack("batch", parts=parts)


class _Queue:
    """Envelopes waiting in order, with a tag each, and their bytes: the bound both sides keep."""

    def __init__(self) -> None:
        self.headers: list[bytes] = []
        self.tags: list[Any] = []
        self.size = 0

    def __len__(self) -> int:
        return len(self.headers)

    def would_overflow(self, header: bytes) -> bool:
        """Whether adding it takes a non-empty queue past MAX_BYTES: send the queue first, so a
        batch stays within MAX_BYTES whatever joins it (one larger envelope goes alone)."""
        return bool(self.headers) and self.size + len(header) > MAX_BYTES

    def add(self, header: bytes, tag: Any = None) -> bool:
        """Queue it; True when the queue is now full (MAX_PARTS or MAX_BYTES) and must be sent."""
        self.headers.append(header)
        self.tags.append(tag)
        self.size += len(header)
        return len(self.headers) >= MAX_PARTS or self.size >= MAX_BYTES

    def message(self) -> bytes:
        """What crosses: the one envelope alone, or the batch of them."""
        return self.headers[0] if len(self.headers) == 1 else pack_batch(self.headers)


class BatchingDealer:
    """A DEALER socket whose frameless sends wait in order and go as one batch: at flush(), when
    the queue is full, or before a message with payload frames."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.queued = _Queue()

    def send(self, header: bytes, flags: int = 0) -> None:
        if self.queued.would_overflow(header):
            self.flush()
        if self.queued.add(header):
            self.flush()

    def send_multipart(self, frames: list[Any], flags: int = 0, copy: bool = True) -> None:
        if len(frames) == 1:
            self.send(frames[0], flags)
            return
        self.flush()
        self.sock.send_multipart(frames, flags, copy=copy)

    def flush(self) -> None:
        if self.queued:
            queued, self.queued = self.queued, _Queue()
            self.sock.send(queued.message())


class RouterBatches:
    """A ROUTER socket's frameless messages to each peer, queued in order with a tag each (the
    network's hold of a delivery); `flush` sends each peer's queue as one batch and hands the tags
    of a peer that could not be reached (gone: ROUTER_MANDATORY) to `lost`."""

    def __init__(self, lost: Callable[[list[Any]], None]):
        self.lost = lost
        self.queued: dict[str, _Queue] = {}

    def add(self, sock: zmq.Socket, peer: str, header: bytes, tag: Any) -> None:
        if peer in self.queued and self.queued[peer].would_overflow(header):
            self.flush_peer(sock, peer)
        if self.queued.setdefault(peer, _Queue()).add(header, tag):
            self.flush_peer(sock, peer)

    def flush_peer(self, sock: zmq.Socket, peer: str) -> None:
        queued = self.queued.pop(peer, None)
        if queued is None:
            return
        try:
            sock.send_multipart([peer.encode(), queued.message()])
        except zmq.ZMQError:
            self.lost(queued.tags)

    def flush(self, sock: zmq.Socket) -> None:
        for peer in list(self.queued):
            self.flush_peer(sock, peer)
