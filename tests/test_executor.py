"""The host's work executor (node/executor.py): work runs earliest ready time first, cohort work is
gathered and run together through run_group, each outcome keeps its own job (and so its ready time),
and a failing work becomes its actor's error report."""
import threading

from node.actor import Reaction
from node.executor import WorkExecutor


def run_all(executor: WorkExecutor, expected: int) -> list:
    """Start the worker, wait until `expected` outcomes are in, stop it; the outcomes in order."""
    done = []
    ready = threading.Event()

    def wake():
        done.extend(executor.finished())
        if len(done) >= expected:
            ready.set()
    worker = threading.Thread(target=executor.work_loop, args=(wake,), daemon=True)
    worker.start()
    assert ready.wait(10)
    executor.stop()
    worker.join(5)
    assert not worker.is_alive()
    return done


def test_work_runs_earliest_ready_time_first():
    ex = WorkExecutor()
    order = []
    for ready_at, name in ((3.0, "c"), (1.0, "a"), (2.0, "b")):
        ex.submit(ready_at, name, hold=0, work=lambda name=name: order.append(name) or name, cohort=False)
    assert ex.busy()
    done = run_all(ex, 3)
    assert order == ["a", "b", "c"]
    assert [(job.actor, job.ready_at, outcome) for job, outcome in done] == [("a", 1.0, "a"), ("b", 2.0, "b"), ("c", 3.0, "c")]
    assert not ex.busy() and ex.busy_for(0.0) == 0.0


def test_cohort_work_runs_together_and_keeps_each_outcome_with_its_job():
    groups, sizes = [], []

    def run_group(works):
        groups.append(len(works))
        return [work() for work in works]
    ex = WorkExecutor(run_group, group_size=3, on_group=sizes.append)
    for i in range(5):
        ex.submit(float(i), f"c{i}", hold=i, work=lambda i=i: i * 10, cohort=True)
    done = run_all(ex, 5)
    assert groups == [3, 2] and sizes == [3, 2]  # at most group_size at once, earliest first
    assert sorted((job.actor, job.hold, outcome) for job, outcome in done) == [(f"c{i}", i, i * 10) for i in range(5)]


def test_a_failing_work_is_its_actors_error_report():
    ex = WorkExecutor()
    ex.submit(1.0, "c7", hold=0, work=lambda: 1 / 0, cohort=False)
    (job, outcome), = run_all(ex, 1)
    assert isinstance(outcome, Reaction)
    report, = outcome.reports
    assert report["type"] == "error" and report["actor"] == "c7" and "ZeroDivisionError" in report["error"]
