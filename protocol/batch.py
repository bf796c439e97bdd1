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


class BatchingDealer:
    """A DEALER socket whose frameless sends wait in order and go as one batch: at flush(), when
    MAX_PARTS or MAX_BYTES are queued, or before a message with payload frames. Everything else is
    the socket's own."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.queued: list[bytes] = []
        self.queued_bytes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)

    def send(self, header: bytes, flags: int = 0) -> None:
        if self.queued and self.queued_bytes + len(header) > MAX_BYTES:
            self.flush()  # (a batch stays within MAX_BYTES, far under the envelope limit, whatever joins it)
        self.queued.append(header)
        self.queued_bytes += len(header)
        if len(self.queued) >= MAX_PARTS or self.queued_bytes >= MAX_BYTES:
            self.flush()

    def send_multipart(self, frames: list[Any], flags: int = 0, copy: bool = True) -> None:
        if len(frames) == 1:
            self.send(frames[0], flags)
            return
        self.flush()
        self.sock.send_multipart(frames, flags, copy=copy)

    def flush(self) -> None:
        if not self.queued:
            return
        queued, self.queued, self.queued_bytes = self.queued, [], 0
        self.sock.send(queued[0] if len(queued) == 1 else pack_batch(queued))


class RouterBatches:
    """A ROUTER socket's frameless messages to each peer, queued in order with a tag each (the
    network's hold of a delivery); `flush` sends each peer's queue as one batch and hands the tags
    of a peer that could not be reached (gone: ROUTER_MANDATORY) to `lost`."""

    def __init__(self, lost: Callable[[list[Any]], None]):
        self.lost = lost
        self.queued: dict[str, tuple[list[bytes], list[Any]]] = {}
        self.queued_bytes: dict[str, int] = {}

    def add(self, sock: zmq.Socket, peer: str, header: bytes, tag: Any) -> None:
        if peer in self.queued and self.queued_bytes[peer] + len(header) > MAX_BYTES:
            self.flush_peer(sock, peer)
        headers, tags = self.queued.setdefault(peer, ([], []))
        headers.append(header)
        tags.append(tag)
        size = self.queued_bytes[peer] = self.queued_bytes.get(peer, 0) + len(header)
        if len(headers) >= MAX_PARTS or size >= MAX_BYTES:
            self.flush_peer(sock, peer)

    def flush_peer(self, sock: zmq.Socket, peer: str) -> None:
        queued = self.queued.pop(peer, None)
        if queued is None:
            return
        del self.queued_bytes[peer]
        headers, tags = queued
        try:
            sock.send_multipart([peer.encode(), headers[0] if len(headers) == 1 else pack_batch(headers)])
        except zmq.ZMQError:
            self.lost(tags)

    def flush(self, sock: zmq.Socket) -> None:
        for peer in list(self.queued):
            self.flush_peer(sock, peer)
