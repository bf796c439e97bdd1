"""How busy a run's shared bottlenecks were over emulated time, from its transfers.csv: the
server's egress and ingress and each shared link (population.shared_links), in Mbit/s per time
bin against the link's capacity.

Each transfer's bytes on the link (link_bytes; for an aborted one, the bytes it had sent) are
spread evenly over its lifetime, t_start to t_end, latency included: the average rate of each
transfer, so the curve is smoothed within a transfer and exact over it (the bytes in every bin
add up to the bytes that crossed)."""
from __future__ import annotations

from dataclasses import dataclass, field

SERVER = "server"


@dataclass
class Bottleneck:
    name: str
    capacity_mbps: float | None  # None: unlimited
    carries: "callable"  # (src, dst) -> bool
    bits: list[float] = field(default_factory=list)  # per bin


def bottlenecks(scenario: dict, population: list[dict[str, str]]) -> list[Bottleneck]:
    """The server's link both ways and each shared link both ways, with what each carries."""
    link = (scenario.get("server") or {}).get("link") or {}
    out = [Bottleneck("server egress (downloads)", link.get("up_mbps"), lambda s, d: s == SERVER),
           Bottleneck("server ingress (uploads)", link.get("down_mbps"), lambda s, d: d == SERVER)]
    for shared in (scenario.get("population") or {}).get("shared_links") or []:
        members = frozenset(r["client"] for r in population if r.get("link") in set(shared.get("links") or []))
        out.append(Bottleneck(f"{shared['name']} up", shared.get("up_mbps"), lambda s, d, m=members: s in m))
        out.append(Bottleneck(f"{shared['name']} down", shared.get("down_mbps"), lambda s, d, m=members: d in m))
    return out


def _bytes_on_link(row: dict[str, str]) -> float:
    if row.get("outcome") == "ok":
        return float(row.get("link_bytes") or row.get("wire_bytes") or 0)
    return float(row.get("wasted_bytes") or 0)


def spread(bins: list[float], width: float, t0: float, t1: float, amount: float) -> None:
    """Add `amount` to `bins` (each `width` seconds from 0), evenly over [t0, t1] (all at t0 if t1 == t0)."""
    last = len(bins) - 1
    if t1 <= t0:
        bins[min(last, max(0, int(t0 / width)))] += amount
        return
    rate = amount / (t1 - t0)
    i = min(last, max(0, int(t0 / width)))
    while i <= last:
        lo, hi = max(t0, i * width), min(t1, (i + 1) * width) if i < last else t1
        if hi > lo:
            bins[i] += rate * (hi - lo)
        if (i + 1) * width >= t1:
            break
        i += 1


def utilisation(transfers: list[dict[str, str]], scenario: dict, population: list[dict[str, str]],
                bins: int = 200) -> dict:
    """{"t": bin starts, "width_s", "series": [{"name", "capacity_mbps", "mbps": per bin, "peak_share"}]}
    for every bottleneck that carried anything."""
    end = max((float(r["t_end"]) for r in transfers if r.get("t_end") not in (None, "")), default=0.0)
    width = max(end / bins, 1e-9)
    found = bottlenecks(scenario, population)
    for b in found:
        b.bits = [0.0] * bins
    for row in transfers:
        amount = 8.0 * _bytes_on_link(row)
        if amount <= 0:
            continue
        for b in found:
            if b.carries(row["src"], row["dst"]):
                spread(b.bits, width, float(row["t_start"]), float(row["t_end"]), amount)
    series = []
    for b in found:
        if not any(b.bits):
            continue
        mbps = [v / width / 1e6 for v in b.bits]
        series.append({"name": b.name, "capacity_mbps": b.capacity_mbps, "mbps": [round(v, 4) for v in mbps],
                       "peak_share": max(mbps) / b.capacity_mbps if b.capacity_mbps else None})
    return {"t": [round(i * width, 6) for i in range(bins)], "width_s": width, "series": series}
