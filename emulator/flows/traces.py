"""Link-capacity traces: a link direction whose rate follows a recorded trace instead of a constant.

Two formats:
- Mahimahi's `mm-link` format: one line per opportunity to deliver one 1500-byte packet, its time in
  integer milliseconds; a time repeats when several packets fit in one millisecond; the trace lasts
  until its last opportunity and `mm-link` loops it from there.
- A rate series: one line per sample, `time_s rate_Mbit/s` (whitespace or a comma between them), as
  the Pensieve-cooked FCC and Norway 3G traces are; a sample's rate holds until the next sample, and
  the last one for the mean gap between samples.

Either becomes a piecewise-constant rate over bins of `bin_s` (the mean rate of each bin): a
Mahimahi trace has an opportunity every millisecond or so, while a flow-level model needs a step only
when the rate moves, and a 100 ms bin keeps a fade (LTE's last about a second) as it is at a tenth of
the events of a 10 ms one. A trace is read from a time offset (clients that share a file do not fade
in lockstep) and loops by default."""
from __future__ import annotations

import bisect
import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PACKET_BITS = 1500 * 8  # one Mahimahi delivery opportunity
DEFAULT_BIN_S = 0.1
OUTAGE_BPS = 1e3  # what the network gives a link while its trace has no capacity (TraceRates.rate)
FORMATS = ("auto", "mahimahi", "series")


class TraceError(ValueError):
    """A trace file that cannot be read; str() names the file, the line and what is wrong."""


class Trace:
    """A rate in bit/s, constant over each bin of bin_s seconds; `period` seconds long. Kept as runs
    (the first bin of each run of equal rates, and its rate: 12 bytes a run): a generated trace of
    600 s in 100 ms bins is 6,000 bins but a few hundred runs, and a large population holds one per
    client link that carries a flow."""

    __slots__ = ("name", "bin_s", "loop", "bins", "starts", "levels", "mean_bps")

    def __init__(self, name: str, bin_s: float, rates, loop: bool = True):
        rates = np.asarray(rates, dtype=float)
        self.name, self.bin_s, self.loop, self.bins = name, bin_s, loop, len(rates)
        starts = np.concatenate(([0], np.flatnonzero(rates[1:] != rates[:-1]) + 1)) if len(rates) else np.zeros(0)
        self.starts = starts.astype(np.int32)
        self.levels = rates[self.starts]
        self.mean_bps = float(rates.mean())  # (the mean over bins, as the array gives it)

    @property
    def rates(self) -> np.ndarray:
        """The rate of every bin."""
        return np.repeat(self.levels, np.diff(self.starts, append=self.bins))

    @property
    def period(self) -> float:
        return self.bin_s * self.bins

    def _index(self, t: float) -> int:
        """The bin that holds time t of the trace (t >= 0): past the end, the looped bin, or the last
        one held for ever without a loop. The bin is computed in whole bins, so a time that is a
        bin boundary falls in the bin it begins."""
        k = math.floor(t / self.bin_s + 1e-9)
        if k < self.bins:
            return k
        return k % self.bins if self.loop else self.bins - 1

    def _run(self, k: int) -> int:
        return int(np.searchsorted(self.starts, k, side="right")) - 1

    def rate_at(self, t: float) -> float:
        return float(self.levels[self._run(self._index(max(0.0, t)))])

    def next_change(self, t: float) -> float:
        """The next bin boundary after t where the rate changes (math.inf when it never does)."""
        t = max(0.0, t)
        k = math.floor(t / self.bin_s + 1e-9)
        n = self.bins
        if k >= n - 1 and not self.loop:
            return math.inf  # the last bin's rate holds for ever
        inside = k % n
        base = k - inside  # the loop's start this time round
        run = self._run(inside)
        if run + 1 < len(self.starts):  # (neighbouring runs differ)
            return (base + int(self.starts[run + 1])) * self.bin_s
        if not self.loop or len(self.starts) == 1:
            return math.inf
        if self.levels[0] != self.levels[run]:  # the loop starts again on another rate
            return (base + n) * self.bin_s
        return (base + n + int(self.starts[1])) * self.bin_s


@dataclass(frozen=True)
class TraceRef:
    """A link direction's trace as the world gives it to the network: the file, how to read it, and
    where in it this link starts."""

    path: str
    offset_s: float = 0.0
    format: str = "auto"
    bin_s: float = DEFAULT_BIN_S
    loop: bool = True
    synthetic: "SyntheticFades | None" = None  # generated (from `seed`) instead of read from `path`
    seed: tuple = ()

    @property
    def source(self) -> "TraceRef":
        """What the trace is made from, whatever the offset it is read from: links that share a
        source share one Trace."""
        return dataclasses.replace(self, offset_s=0.0)


def detect_format(lines: list[str]) -> str:
    """mahimahi when every line is one integer, series when they are two numbers."""
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        return "mahimahi" if re.fullmatch(r"\d+", text) else "series"
    return "mahimahi"


def parse_mahimahi(lines: list[str], name: str, bin_s: float = DEFAULT_BIN_S, loop: bool = True) -> Trace:
    """Opportunities per bin times 1500 bytes, over the bin: the bin's mean rate. The trace lasts
    until its last opportunity (as mm-link loops it), in whole bins (the last one partly filled)."""
    times: list[int] = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        if not re.fullmatch(r"\d+", text):
            raise TraceError(f"{name}:{number}: expected a delivery time in whole milliseconds, got {text[:40]!r}")
        ms = int(text)
        if times and ms < times[-1]:
            raise TraceError(f"{name}:{number}: time {ms} ms goes back (after {times[-1]} ms)")
        times.append(ms)
    if not times or times[-1] <= 0:
        raise TraceError(f"{name}: no delivery opportunity after 0 ms (an empty or zero-length trace)")
    duration_s = times[-1] / 1000.0
    bins = max(1, math.ceil(duration_s / bin_s - 1e-9))
    counts = np.zeros(bins)
    for ms in times:
        counts[min(bins - 1, int(ms / 1000.0 / bin_s))] += 1
    return Trace(name, bin_s, counts * (PACKET_BITS / bin_s), loop)


def parse_series(lines: list[str], name: str, bin_s: float = DEFAULT_BIN_S, loop: bool = True) -> Trace:
    """Samples (time_s, Mbit/s), each held until the next; the last for the mean gap. Each bin's rate
    is the time average over it."""
    samples: list[tuple[float, float]] = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = [p for p in re.split(r"[,\s]+", text) if p]
        try:
            if len(parts) != 2:
                raise ValueError
            t, mbps = float(parts[0]), float(parts[1])
        except ValueError:
            raise TraceError(f"{name}:{number}: expected 'time_s rate_Mbit/s', got {text[:40]!r}") from None
        if not (math.isfinite(t) and math.isfinite(mbps)) or mbps < 0:
            raise TraceError(f"{name}:{number}: a time and a rate >= 0 must be finite numbers, got {text[:40]!r}")
        if samples and t <= samples[-1][0]:
            raise TraceError(f"{name}:{number}: time {t} s does not come after {samples[-1][0]} s")
        samples.append((t, mbps * 1e6))
    if len(samples) < 2:
        raise TraceError(f"{name}: a rate series needs at least two samples")
    start = samples[0][0]
    times = [t - start for t, _ in samples]
    gap = times[-1] / (len(times) - 1)
    ends = times[1:] + [times[-1] + gap]
    duration_s = ends[-1]
    bins = max(1, math.ceil(duration_s / bin_s - 1e-9))
    rates = []
    for k in range(bins):
        lo, hi = k * bin_s, min((k + 1) * bin_s, duration_s)
        i = max(0, bisect.bisect_right(times, lo) - 1)
        bits = 0.0
        while i < len(times) and times[i] < hi:
            bits += samples[i][1] * (min(hi, ends[i]) - max(lo, times[i]))
            i += 1
        rates.append(bits / (hi - lo))
    return Trace(name, bin_s, np.array(rates), loop)


def parse_trace(text: str, name: str, fmt: str = "auto", bin_s: float = DEFAULT_BIN_S, loop: bool = True) -> Trace:
    if fmt not in FORMATS:
        raise TraceError(f"{name}: unknown trace format {fmt!r} (use {', '.join(FORMATS)})")
    lines = text.splitlines()
    if fmt == "auto":
        fmt = detect_format(lines)
    return (parse_mahimahi if fmt == "mahimahi" else parse_series)(lines, name, bin_s, loop)


def load_trace(ref: TraceRef) -> Trace:
    if ref.synthetic is not None:
        trace = ref.synthetic.trace(list(ref.seed), ref.bin_s)
        trace.loop = ref.loop  # (without a loop, the last bin's rate holds)
        return trace
    path = Path(ref.path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the trace ({type(exc).__name__}: {exc})") from None
    return parse_trace(text, str(path), ref.format, ref.bin_s, ref.loop)


class TraceRates:
    """The traces of a run's links, each file read once and each generated trace made once, when a
    flow first uses a link that follows it (most of a large population's links never carry one);
    and each link's rate at a time of the run: its trace read from its offset."""

    def __init__(self, refs: dict[tuple[str, str], TraceRef]):
        self.refs = refs
        self.cache: dict[TraceRef, Trace] = {}
        self.traces: dict[tuple[str, str], Trace] = {}

    def __contains__(self, link) -> bool:
        return link in self.refs

    def _trace(self, link) -> Trace:
        trace = self.traces.get(link)
        if trace is None:
            ref = self.refs[link]
            if ref.source not in self.cache:
                self.cache[ref.source] = load_trace(ref)
            trace = self.traces[link] = self.cache[ref.source]
        return trace

    def mean(self, link) -> float:
        """The link's mean rate over its trace (bit/s; at least OUTAGE_BPS); a generated trace's is
        the mean it was made for (nothing is generated to know it)."""
        synthetic = self.refs[link].synthetic
        return max(OUTAGE_BPS, synthetic.mean_bps if synthetic is not None else self._trace(link).mean_bps)

    def rate(self, link, t: float) -> float:
        """The link's capacity at t. An outage (no capacity in the trace) is OUTAGE_BPS: the flow
        model divides by capacities (serialization, queueing delay), and at 1 kbit/s a 2 s outage
        moves 250 bytes, which no transfer notices."""
        return max(OUTAGE_BPS, self._trace(link).rate_at(t + self.refs[link].offset_s))

    def next_change(self, link, t: float) -> float:
        """The run's time of the link's next rate change after t."""
        offset = self.refs[link].offset_s
        return self._trace(link).next_change(t + offset) - offset


# ---- synthetic traces ----------------------------------------------------------------------------
@dataclass(frozen=True)
class SyntheticFades:
    """A seeded Markov-modulated cellular link for scenarios that ship no trace files: good periods
    whose level is redrawn every `good_step_s` (lognormal, coefficient of variation `good_cv`),
    interrupted by fades to `fade_level` of the mean and by outages (no capacity), each of
    exponential length. The defaults are fitted to the 13 public Mahimahi cellular recordings
    (LTE, UMTS, EVDO; `python tools/trace_stats.py FILES` prints these figures for any traces) in 1 s
    bins: time below 30 % of the mean 7-22 % (median 11 %), those fades lasting 1.1-5.1 s on average
    (median 2.7 s), outages 0-9 % of the time (median 1 %), coefficient of variation 0.42-0.89 (median
    0.6). The generated rate is scaled so that its mean over `duration_s` is exactly `mean_mbps`."""

    mean_mbps: float
    fade_share: float = 0.11
    fade_s: float = 2.7
    fade_level: float = 0.15
    outage_share: float = 0.01
    outage_s: float = 2.0
    good_cv: float = 0.45
    good_step_s: float = 2.0
    duration_s: float = 600.0  # generated once, then looped

    @property
    def mean_bps(self) -> float:
        """The mean rate it is made for (the generated bins' float mean may differ from it in the
        last bit): what a link's nominal rate is, known without generating the trace."""
        return self.mean_mbps * 1e6

    def period(self, bin_s: float = DEFAULT_BIN_S) -> float:
        """How long its trace is (what trace(...).period gives, without generating it)."""
        return bin_s * self.bins(bin_s)

    def bins(self, bin_s: float) -> int:
        return max(1, round(self.duration_s / bin_s))

    def trace(self, seed: int | list[int], bin_s: float = DEFAULT_BIN_S) -> Trace:
        rng = np.random.default_rng(seed)
        bad = self.fade_share + self.outage_share
        # alternate a good period with a fade or an outage; the good periods' mean length gives the shares
        p_fade = self.fade_share / bad if bad > 0 else 0.0
        bad_s = p_fade * self.fade_s + (1 - p_fade) * self.outage_s
        good_s = bad_s * (1 - bad) / bad if bad > 0 else math.inf
        good_mean = (1 - self.fade_share * self.fade_level) / (1 - bad)  # so the whole mean is 1
        sigma = math.sqrt(math.log(1 + self.good_cv**2))
        bins = self.bins(bin_s)
        counts: list[int] = []  # the runs of bins, each at its level (a bin is the level of the period it starts in)
        levels: list[float] = []
        t, k = 0.0, 0
        while k < bins:
            end = t + (rng.exponential(good_s) if good_s < math.inf else self.duration_s)
            steps = []  # good: a level per step, each step's bins (none for a step inside one bin)
            while t < end and k < bins:
                t = min(end, t + self.good_step_s)
                last = min(bins, max(k, math.ceil(t / bin_s - 1e-9)))
                steps.append(last - k)
                k = last
            if steps:  # (drawn at once: the same draws, in the same order, as one at a time)
                drawn = (good_mean * rng.lognormal(-sigma**2 / 2, sigma, size=len(steps))).tolist()
                for count, level in zip(steps, drawn):
                    if count:
                        counts.append(count)
                        levels.append(level)
            if bad > 0 and k < bins:
                fade = rng.random() < p_fade
                t += rng.exponential(self.fade_s if fade else self.outage_s)
                last = min(bins, max(k, math.ceil(t / bin_s - 1e-9)))
                if last > k:
                    counts.append(last - k)
                    levels.append(self.fade_level if fade else 0.0)
                k = last
        rel = np.repeat(np.array(levels, dtype=float), counts)
        scale = self.mean_mbps * 1e6 / rel.mean() if rel.mean() > 0 else self.mean_mbps * 1e6
        return Trace(f"synthetic({self.mean_mbps} Mbit/s)", bin_s, rel * scale)
