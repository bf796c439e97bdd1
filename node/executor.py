"""A host's work executor. Actors hand it keyed, deterministic work: a closure (a training session,
say) with the emulated time its outcome is ready at, the actor it belongs to and the hold that the
network keeps on that actor meanwhile. One worker thread runs the work, earliest ready time first;
where the host's trainer can train several clients at once (node/cohort.py's run_group), queued
work marked `cohort` is gathered and run together. Running work early or batched changes wall time
only: each outcome keeps its own ready time, and the runtime (node/runtime.py) sends it at that
emulated time, so the run is the same whichever way the executor ran it."""
from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .actor import Reaction

COHORT_QUIET_S = 0.002  # a cohort stops waiting for more work once deliveries pause this long (wall time only)
COHORT_LINGER_S = 0.02  # and waits at most this long


@dataclass(order=True)
class Job:
    ready_at: float
    seq: int
    actor: str = field(compare=False)
    hold: int = field(compare=False)
    work: Callable[[], Reaction | Callable[[], Reaction]] = field(compare=False)
    cohort: bool = field(compare=False, default=False)


class WorkExecutor:
    def __init__(self, run_group: Callable[[list[Callable[[], Any]]], list[Any]] | None = None, group_size: int = 1,
                 on_group: Callable[[int], None] = lambda size: None):
        """run_group runs works together and returns their outcomes in order (up to group_size of
        them); on_group(size) is told of each group run so."""
        self.run_group = run_group
        self.group_size = group_size if run_group is not None else 1
        self.on_group = on_group
        self._jobs: list[Job] = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._finished: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = False
        self._started: float | None = None  # wall time the current job began
        self._last_delivery = 0.0  # wall time of the latest delivery (cohorts gather while they come)

    # ---- the runtime's side ------------------------------------------------------------------
    def submit(self, ready_at: float, actor: str, hold: int, work: Callable, cohort: bool) -> None:
        with self._cv:
            heapq.heappush(self._jobs, Job(ready_at, next(self._seq), actor, hold, work, cohort))
            self._cv.notify()

    def delivered(self) -> None:
        """A delivery reached the host: a cohort being gathered waits for the work it may bring."""
        self._last_delivery = time.monotonic()

    def finished(self) -> Iterator[tuple[Job, Any]]:
        """The jobs done since the last call, with their outcomes."""
        while True:
            try:
                yield self._finished.get_nowait()
            except queue.Empty:
                return

    def busy(self) -> bool:
        """Work queued, running, or done and not yet taken."""
        with self._cv:
            return bool(self._jobs) or self._started is not None or not self._finished.empty()

    def busy_for(self, now: float) -> float:
        """Wall seconds the current job has run (0 when none runs)."""
        started = self._started
        return 0.0 if started is None else max(0.0, now - started)

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    # ---- the worker thread ----------------------------------------------------------------------
    def work_loop(self, wake: Callable[[], None]) -> None:
        """Run jobs until stopped; `wake` tells the runtime's socket loop that outcomes are ready."""
        while True:
            with self._cv:
                while not self._jobs and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                group = [heapq.heappop(self._jobs)]
                if group[0].cohort and self.group_size > 1:
                    self._gather_cohort(group)
                self._started = time.monotonic()
            if len(group) == 1:
                outcomes = [self._guarded(group[0])()]
            else:
                self.on_group(len(group))
                outcomes = self.run_group([self._guarded(job) for job in group])
            for job, outcome in zip(group, outcomes):
                self._finished.put((job, outcome))
            self._started = None
            wake()

    def _gather_cohort(self, group: list[Job]) -> None:
        """Fill the group with queued cohort jobs, waiting for more while deliveries keep coming
        (the tasks of a round reach a host one delivery after another, a fraction of a millisecond
        apart in wall time): until the socket has been quiet for COHORT_QUIET_S, at most
        COHORT_LINGER_S. Called with the job lock held."""
        deadline = time.monotonic() + COHORT_LINGER_S
        while True:
            group += self._take_cohort(self.group_size - len(group))
            now = time.monotonic()
            quiet_until = self._last_delivery + COHORT_QUIET_S
            if len(group) >= self.group_size or now >= min(deadline, quiet_until) or self._stopping:
                return
            self._cv.wait(min(deadline, quiet_until) - now)

    def _take_cohort(self, most: int) -> list[Job]:
        """Up to `most` more queued cohort jobs, earliest first, taken out of the queue. Their
        outcomes keep their own ready times: running them early changes wall time only."""
        chosen = heapq.nsmallest(most, (job for job in self._jobs if job.cohort))
        if chosen:
            taken = {id(job) for job in chosen}
            self._jobs = [job for job in self._jobs if id(job) not in taken]
            heapq.heapify(self._jobs)
        return chosen

    @staticmethod
    def _guarded(job: Job) -> Callable[[], Any]:
        """The job's work, with an exception turned into an error report of its actor."""
        def run():
            try:
                return job.work()
            except Exception:
                traceback.print_exc()
                return Reaction(reports=[{"type": "error", "actor": job.actor, "error": traceback.format_exc(limit=3)}])
        return run
