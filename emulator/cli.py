"""Command line: python -m emulator run|validate ..."""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click

from node.lifecycle import dump_stacks_on_sigusr1

from .scenario import ScenarioError, load_scenario


def _fail(scenario: Path, exc: ScenarioError) -> None:
    message = str(exc)
    if not message.startswith(str(scenario)):
        message = f"{scenario}: {message}"
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@click.group()
def main() -> None:
    """A multi-process network emulator for federated learning."""
    dump_stacks_on_sigusr1()


def _set_log_level(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    from node import logs

    if value is not None:
        logs.set_level(value)  # in the environment of every process the run starts
    logs.configure("conductor")


def _log_option(command):
    return click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None,
                        expose_value=False, is_eager=True, callback=_set_log_level,
                        help="What the run's processes log to stderr: warning (default) says what went wrong, info "
                             "what is built and started and each round, debug every message and delivery "
                             "[env: EMULATOR_LOG_LEVEL].")(command)


def _progress_options(command):
    command = click.option("--plain", is_flag=True, help="One line per round even on a terminal (no live panel).")(command)
    command = click.option("--json-progress", is_flag=True, help="Print one JSON object per line on stdout: each round "
                           "as it finishes, each incident, the summary last.")(command)
    return click.option("--quiet", is_flag=True, help="Print nothing while the run goes, only its outcome.")(command)


def _view_mode(quiet: bool, json_progress: bool, plain: bool) -> str:
    return "json" if json_progress else "quiet" if quiet else "plain" if plain else "auto"


def _stop_on_signals() -> None:
    """Ctrl-C must stop a run even when started from a context that ignores SIGINT (a background
    job of a script), which Python would otherwise inherit and keep. SIGTERM and SIGHUP stop it
    the same way."""
    from .conductor import raise_stop_signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, raise_stop_signal)


def _stopped_early(exc: KeyboardInterrupt) -> None:
    from .conductor import StopSignal

    signum = exc.signum if isinstance(exc, StopSignal) else signal.SIGINT
    click.echo(f"stopped by {signal.Signals(signum).name} before the run started; nothing was written", err=True)
    sys.exit(128 + signum)


def _hosts_option(value: str | None) -> int | None:
    """--hosts remote:N -> N (Placement.check says whether N is a number of hosts)."""
    if value is None:
        return None
    kind, _, count = value.partition(":")
    if kind != "remote" or not count.isdigit():
        raise click.BadParameter(f"{value!r}: expected remote:N (local hosts: population.hosts)", param_hint="--hosts")
    return int(count)


def _placement_options(command):
    """Where the hosts run: here (forked), or on other machines (joining over TCP, or Ray tasks)."""
    options = [
        click.option("--hosts", "remote_hosts", metavar="remote:N", help="Wait for N client hosts that join over TCP "
                     "(python -m emulator host --connect ...) instead of forking them here. Needs --listen."),
        click.option("--listen", metavar="tcp://ADDR:PORT", help="Where remote hosts join (the lobby); the network "
                     "listens on PORT+1 (PORT 0: any free ports). CURVE-encrypted, only the run's host keys are admitted."),
        click.option("--keys", "keys", type=click.Path(dir_okay=False, path_type=Path), metavar="CONDUCTOR_KEY",
                     help="A conductor.key from `python -m emulator keys` (default: keys made for the run in RUN_DIR/keys)."),
        click.option("--launcher", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                     help="ray: start the hosts as Ray tasks (pip install -e '.[ray]'; RAY_ADDRESS or --ray-address "
                     "picks the cluster, else a local Ray); their number is --hosts remote:N or population.hosts."),
        click.option("--ray-address", help="The Ray cluster to use (default: $RAY_ADDRESS, else a local one)."),
        click.option("--ray-cpus-per-host", type=float, default=1.0, show_default=True, help="Ray resources of one host."),
        click.option("--ray-gpus-per-host", type=float, default=0.0, show_default=True,
                     help="Ray GPU share of one host (0.25: four hosts per GPU)."),
        click.option("--serve-data-mb", type=click.FloatRange(min=0), default=1024.0, show_default=True,
                     help="The most data the lobby sends one host that has no data set of its own (its clients' rows)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _placement(remote_hosts: str | None, listen: str | None, keys: Path | None, launcher: str, ray_address: str | None,
               ray_cpus_per_host: float, ray_gpus_per_host: float, serve_data_mb: float):
    from .placement import Placement

    count = _hosts_option(remote_hosts)
    return Placement("ray" if launcher == "ray" else "remote" if count is not None else "local", count, listen, keys,
                     ray_address, ray_cpus_per_host, ray_gpus_per_host, serve_data_mb)


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a scenario key (dotted path).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Run directory (default: output.dir/NAME-TIME).")
@_placement_options
@click.option("--trace", "with_trace", is_flag=True, help="Also write RUN_DIR/trace.json (run.trace): the run as a "
              "timeline for Perfetto UI or chrome://tracing.")
@_progress_options
@_log_option
def run(scenario: Path, overrides: tuple[str, ...], out: Path | None, with_trace: bool, quiet: bool,
        json_progress: bool, plain: bool, **where) -> None:
    """Run SCENARIO and write its run directory. On a terminal a live panel shows the round in
    progress; elsewhere (logs, CI) one line per round."""
    from .conductor import run_scenario  # heavy imports only when running
    from .placement import PlacementError
    from .progress import make_view

    _stop_on_signals()
    placement = _placement(**where)
    try:
        sc, resolved = load_scenario(scenario, [*overrides, *(["run.trace=true"] if with_trace else [])])
        view = make_view(_view_mode(quiet, json_progress, plain), sc.rounds, _peer_traffic(sc), sc.clock.mode == "realtime")
        summary = run_scenario(sc, resolved, out, view, placement)
    except PlacementError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except ScenarioError as exc:
        _fail(scenario, exc)
    except KeyboardInterrupt as exc:  # before the run directory existed
        _stopped_early(exc)
    _finish(summary, json_progress)


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@_placement_options
@_progress_options
@_log_option
def resume(run_dir: Path, quiet: bool, json_progress: bool, plain: bool, **where) -> None:
    """Continue the interrupted or crashed run in RUN_DIR from its last checkpoint (scenarios with
    run.checkpoint_every). The rounds after the checkpoint are run again; the CSV files are cut
    back to the checkpoint first, so they end up as an uninterrupted run would have written them.
    Its hosts are forked here, or join from other machines as for `run` (the run's own keys in
    RUN_DIR/keys are used again)."""
    from .conductor import ResumeError, resume_run
    from .progress import make_view

    _stop_on_signals()
    mode = _view_mode(quiet, json_progress, plain)
    try:
        summary = resume_run(run_dir, lambda sc: make_view(mode, sc.rounds, _peer_traffic(sc), False), _placement(**where))
    except ResumeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt as exc:
        _stopped_early(exc)
    _finish(summary, json_progress)


def _peer_traffic(sc) -> bool:
    from .topology import TOPOLOGIES
    return TOPOLOGIES[sc.topology].peer_traffic


def _finish(summary: dict, json_progress: bool) -> None:
    """The outcome in words (and as JSON with --json-progress), the plots, the exit code."""
    from .conductor import exit_code

    traffic = (f"payload peer-to-peer {summary['payload_gib_peer']:.4f} GiB" if summary.get("payload_bytes_peer") else
               f"payload up {summary['payload_gib_up']:.4f} GiB down {summary['payload_gib_down']:.4f} GiB")
    if json_progress:  # stdout stays one JSON object per line; the words go to stderr
        keep = ("status", "reason", "rounds_completed", "emulated_time_s", "wall_time_s", "best_accuracy", "payload_gib_up",
                "payload_gib_down", "payload_gib_peer", "run_dir")
        click.echo(json.dumps({"type": "summary", **{k: summary.get(k) for k in keep}}))
    click.echo(
        f"{summary['status']}: {summary['rounds_completed']} rounds, emulated {summary['emulated_time_s']:.3f} s, "
        f"wall {summary['wall_time_s']:.1f} s, best accuracy {summary['best_accuracy']}, {traffic}", err=json_progress
    )
    refused = summary.get("refused_messages")
    if refused and refused.get("total"):
        click.echo(f"refused {refused['total']} messages from {len(refused['by_peer'])} peers that are not the run's or "
                   f"broke its protocol (summary.json: refused_messages)", err=json_progress)
    click.echo(f"results: {summary['run_dir']}", err=json_progress)
    run_dir = Path(summary["run_dir"])
    if summary.get("storage_failed"):  # nothing more is written where nothing more fits
        click.echo(f"error: {summary.get('reason')}", err=True)
        sys.exit(exit_code(summary))
    if summary["status"] in ("no_clients", "failed"):
        click.echo(f"{summary['status']}: {summary.get('reason')}", err=True)
    if summary["status"] in ("interrupted", "terminated"):  # the user wants out now; plots can wait
        click.echo(f"{summary['status']}: {summary.get('reason')}; plots not written "
                   f"(python -m emulator report {run_dir} writes them)", err=True)
        if (run_dir / "checkpoint").exists():
            click.echo(f"python -m emulator resume {run_dir} continues it from round {summary.get('checkpoint', {}).get('rounds')}",
                       err=True)
    else:
        _write_plots(run_dir, err=json_progress)
    sys.exit(exit_code(summary))


def _write_plots(run_dir: Path, err: bool = False) -> None:
    try:
        from .report import plot

        plots = plot(run_dir)
        click.echo(f"plots: {len(plots)} in {run_dir / 'plots'}", err=err)
    except Exception as exc:  # plotting must never cost the results, which are already on disk
        click.echo(f"warning: plots not written ({type(exc).__name__}: {exc})", err=True)
    try:
        from .htmlreport import write_report

        click.echo(f"report: {write_report(run_dir)}", err=err)
    except Exception as exc:  # (the same: the CSVs are what counts)
        click.echo(f"warning: report.html not written ({type(exc).__name__}: {exc})", err=True)


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE")
def validate(scenario: Path, overrides: tuple[str, ...]) -> None:
    """Check SCENARIO against the schema and, where its data set is found, everything built from
    the data (partition, clients, faults). A data set that is not on this machine is a warning: the
    scenario is valid, and `run` says the same where it would fail."""
    from .world import build_world, load_task

    try:
        sc, _ = load_scenario(scenario, list(overrides))
    except ScenarioError as exc:
        _fail(scenario, exc)
    try:
        task = load_task(sc, fetch=False)  # validating downloads nothing
    except ScenarioError as exc:
        click.echo(f"warning: {scenario}: not checked against its data: {exc}", err=True)
        click.echo(f"{scenario}: schema ok ({sc.population.clients} clients, {sc.rounds} rounds); its data set is not here")
        return
    try:
        build_world(sc, task)
    except ScenarioError as exc:
        _fail(scenario, exc)
    click.echo(f"{scenario}: ok ({sc.population.clients} clients, {sc.rounds} rounds)")


@main.command(name="compare")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--target", type=float, help="Accuracy (0-1) for time-to-target; default: each run's eval.target_accuracy.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Where compare.csv, compare.md and compare.html go.")
def compare_cmd(run_dirs: tuple[Path, ...], target: float | None, out: Path) -> None:
    """Compare RUN_DIRS: best accuracy, payload GiB, saving vs fp32, emulated time, time to target; and
    compare.html, the runs' curves side by side."""
    from .compare import CompareError, compare, markdown, write

    try:
        rows = compare(list(run_dirs), target)
    except CompareError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    from .htmlcompare import write_compare_html

    click.echo(markdown(rows), nl=False)
    csv_path, md_path = write(rows, out)
    html_path = write_compare_html(rows, list(run_dirs), out)
    click.echo(f"written: {csv_path} {md_path} {html_path}")


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
def trace(run_dir: Path) -> None:
    """Write RUN_DIR/trace.json: the run as a timeline for Perfetto UI or chrome://tracing (a track
    per client with its check-ins, downloads, compute and uploads; the rounds; bytes in flight)."""
    from .tracefile import write_trace

    if not (run_dir / "clients.csv").exists():
        click.echo(f"error: {run_dir}: not a run directory (no clients.csv)", err=True)
        sys.exit(2)
    click.echo(f"trace: {write_trace(run_dir)}")


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--round", "gantt_round", type=int, help="Round for the Gantt timeline (default: the one with most dropouts).")
def report(run_dir: Path, gantt_round: int | None) -> None:
    """Print RUN_DIR's summary, write its plots to RUN_DIR/plots and the whole run on one page to
    RUN_DIR/report.html."""
    from .htmlreport import write_report
    from .report import ReportError, load, plot, summary_text

    try:
        summary, _, _ = load(run_dir)
        click.echo(summary_text(summary))
        for path in plot(run_dir, gantt_round):
            click.echo(f"plot: {path}")
        click.echo(f"report: {write_report(run_dir)}")
    except ReportError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


@main.command()
@click.option("--connect", required=True, metavar="tcp://ADDR:PORT", help="The run's lobby (its run --listen address).")
@click.option("--key", "key", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="This host's key file (host-K.key from `python -m emulator keys`, or RUN_DIR/keys/host-1.key).")
@click.option("--data-root", help="This machine's data folder (default: $EMULATOR_DATA, else the scenario's task.data_root).")
@click.option("--threads", type=int, help="Torch threads for training (default: this machine's usable cores).")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds to wait for the run to answer (a host may start before the run does).")
@click.option("--slot", default="", help="Ask for this host slot (host0, host1, ...); default: any free one.")
@click.option("--data", type=click.Choice(["auto", "local", "lobby"]), default="auto", show_default=True,
              help="Where the clients' samples come from: local (this machine's data root), lobby (the conductor "
              "sends the rows this host's clients hold), auto (local where the data set is found, else the lobby).")
@_log_option
def host(connect: str, key: Path, data_root: str | None, threads: int | None, timeout_s: float, slot: str,
         data: str) -> None:
    """Join a run as one of its client hosts, from this machine (by hand, or from a Slurm,
    Kubernetes or Ray job). Exits 0 when the run ends, 2 when the run refuses this host."""
    from .host import run_host

    if threads is not None and threads < 1:
        raise click.BadParameter(f"{threads}: at least 1", param_hint="--threads")
    sys.exit(run_host(connect, key, data_root, threads, timeout_s, slot, data))


@main.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--hosts", "count", type=click.IntRange(min=1), default=1, show_default=True, help="Host key files to make.")
def keys(folder: Path, count: int) -> None:
    """Make CURVE keys for runs with remote hosts: FOLDER/conductor.key (run --keys) and
    FOLDER/host-K.key (host --key), readable by their owner only."""
    from protocol.curve import make_keys

    _, paths = make_keys(folder, count)
    click.echo(f"written: {folder / 'conductor.key'} (for run --keys) and {len(paths)} host key(s): "
               + " ".join(str(p) for p in paths))
