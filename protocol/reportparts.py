"""Reports larger than one envelope: a peer sends them in parts, the conductor joins them.

A round's report names every selected client with its status and outcome (about 270 bytes each),
so a round of 4,000 clients is over `MAX_ENVELOPE_BYTES`, and the network would refuse it. The
envelope limit stays (it bounds what a hostile peer can make the network decode); a report over
it travels as `report` envelopes whose body is `{"type": "part", "id", "index", "of", "data"}`,
`data` a slice of the msgpack'd body. The network forwards them as any report (adding `t_net`);
`ReportJoiner` gives the whole body back once the last part has come, with the last part's
`t_net` (the time the network forwarded the report, as for a report in one piece)."""
from __future__ import annotations

from typing import Any

import msgpack

from .envelope import MAX_ENVELOPE_BYTES, pack

PART_BYTES = MAX_ENVELOPE_BYTES // 2  # a part's slice: its envelope stays well under the limit
# a report over this goes in parts: the network adds its time (and the clock's lag) to what it forwards
SPLIT_ABOVE_BYTES = MAX_ENVELOPE_BYTES - 64 * 1024
MAX_PARTS = 64  # a report of at most 32 MiB: a round of about 120,000 clients
MAX_OPEN_PER_PEER = 4  # reports of one peer being joined at once (a hostile peer cannot hoard memory)
PART_FIELDS = frozenset({"peer", "type", "id", "index", "of", "data", "t_net", "lag"})


def report_parts(peer: str, body: dict[str, Any], report_id: int) -> list[bytes]:
    """The `report` envelopes that carry `body` from `peer`: one where it fits, else its parts."""
    whole = pack("report", body={"peer": peer, **body})
    if len(whole) <= SPLIT_ABOVE_BYTES:
        return [whole]
    data = msgpack.packb(body, use_bin_type=True)
    slices = [data[i:i + PART_BYTES] for i in range(0, len(data), PART_BYTES)]
    if len(slices) > MAX_PARTS:
        raise ValueError(f"a report of {len(data)} bytes is over the {MAX_PARTS * PART_BYTES} bytes a report may take")
    return [pack("report", body={"peer": peer, "type": "part", "id": report_id, "index": k, "of": len(slices),
                                 "data": piece})
            for k, piece in enumerate(slices)]


class ReportJoiner:
    """Joins the parts of reports as they come (in order, per peer: they share one socket)."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, int], list[bytes]] = {}

    def add(self, part: dict[str, Any]) -> dict[str, Any] | None:
        """The whole report once `part` completes it; None while parts are missing. Raises
        ValueError naming what is wrong with a malformed part."""
        peer, rid, index, of, data = (part.get(k) for k in ("peer", "id", "index", "of", "data"))
        if set(part) - PART_FIELDS or not isinstance(peer, str) or not isinstance(data, bytes):
            raise ValueError("a report part needs a peer and bytes of data, and nothing else")
        if not (isinstance(rid, int) and isinstance(index, int) and isinstance(of, int) and 0 <= index < of <= MAX_PARTS):
            raise ValueError(f"report part {index!r} of {of!r} (id {rid!r}) is out of range (at most {MAX_PARTS} parts)")
        key = (peer, rid)
        got = self.open.setdefault(key, [])
        if len(got) != index:
            del self.open[key]
            raise ValueError(f"report {rid} of {peer}: part {index} came after {len(got)} parts")
        got.append(data)
        mine = [k for k in self.open if k[0] == peer]
        for stale in mine[:-MAX_OPEN_PER_PEER]:
            del self.open[stale]
        if len(got) < of:
            return None
        del self.open[key]
        try:
            body = msgpack.unpackb(b"".join(got), raw=False, strict_map_key=True)
        except Exception as exc:
            raise ValueError(f"report {rid} of {peer} does not decode ({type(exc).__name__})") from None
        if not isinstance(body, dict):
            raise ValueError(f"report {rid} of {peer} is not a map")
        extra = {k: part[k] for k in ("t_net", "lag") if k in part}
        return {"peer": peer, **body, **extra}
