"""The ``strategyjob`` command line. ``run`` is the local launcher; ``convert`` turns a Kubeflow
TFJob into a StrategyJob; ``submit``, ``list``,
``status``, ``logs`` and ``delete`` work on a cluster through :mod:`strategyjob.client`.

Exit codes: 0 done, 1 the cluster refused or the job failed (one line on stderr, never a
traceback), 2 bad input (usage, an unreadable manifest), 130 interrupted.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from strategyjob import __version__
from strategyjob.errors import ClusterError, JobFailedError, StrategyJobError


def seconds(text: str) -> float:
    """A duration option: a finite number of seconds, 0 or more. A negative one would be
    taken as 0 further down (``--grace-period -5``: SIGKILL at once), silently."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds, 0 or more (got {text!r}); e.g. 10"
        )
    return value


#: The documentation page of each command (the repository's ``docs/``; ``mkdocs serve`` shows
#: them as a site), named at the end of its ``--help``.
DOCS = {
    "strategyjob": "docs/index.md",
    "run": "docs/getting-started.md",
    "convert": "docs/kubernetes/migrating-from-tfjob.md",
    "submit": "docs/kubernetes/client.md",
    "list": "docs/kubernetes/client.md",
    "status": "docs/kubernetes/client.md",
    "logs": "docs/kubernetes/client.md",
    "scale": "docs/kubernetes/elastic.md",
    "metrics": "docs/kubernetes/progress-and-security.md",
    "tensorboard": "docs/guide/summaries.md",
    "delete": "docs/kubernetes/client.md",
}


def docs_epilog(command: str) -> str:
    return f"Documentation: {DOCS[command]} (in the repository; mkdocs serve shows the site)."


def build_parser() -> argparse.ArgumentParser:
    from strategyjob.jobspec import STRATEGIES

    parser = argparse.ArgumentParser(
        prog="strategyjob",
        description="Run tf.distribute-style training jobs on PyTorch, locally or on Kubernetes.",
        epilog=docs_epilog("strategyjob"),
    )
    parser.add_argument("--version", action="version", version=f"strategyjob {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    _add_run_command(commands)
    _add_convert_command(commands, STRATEGIES)
    _add_cluster_commands(commands)
    for name, command in commands.choices.items():
        command.epilog = docs_epilog(name)
    return parser


def _add_run_command(commands: Any) -> None:
    """run: the local launcher and its options."""
    run = commands.add_parser(
        "run",
        help="run a StrategyJob (or Kubeflow TFJob) manifest locally, one process per replica",
        description=(
            "Run a StrategyJob manifest on this machine: one process per replica, with "
            "TF_CONFIG and the torch rendezvous variables on 127.0.0.1. A Kubeflow TFJob runs "
            "too: its tensorflow containers, with TF_CONFIG as training-operator writes it. "
            "Exits 0 if the job succeeded, 1 if it failed, 2 if the manifest is invalid."
        ),
    )
    run.add_argument("manifest", metavar="FILE.yaml", help="the StrategyJob or TFJob manifest")
    run.add_argument(
        "--grace-period",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help=(
            "time between SIGTERM and SIGKILL when stopping replicas (default: the pod "
            "templates' terminationGracePeriodSeconds, else 10)"
        ),
    )
    live = run.add_mutually_exclusive_group()
    live.add_argument(
        "--no-status",
        action="store_true",
        help="do not show the live status line (it is shown only on a terminal anyway)",
    )
    live.add_argument(
        "--curves",
        action="store_true",
        help=(
            "draw the curves of the metrics the job reports (strategyjob.report) above the "
            "status line, redrawn as reports arrive; and once more, as plain lines, when the "
            "job ends (the only drawing when stdout is not a terminal)"
        ),
    )
    run.add_argument(
        "--metrics",
        metavar="FILE",
        help=(
            "when the job ends, write the history of the metrics it reported "
            "(strategyjob.report) to FILE (JSON; print it with strategyjob metrics --file FILE)"
        ),
    )
    run.set_defaults(handler=_run)


def _add_convert_command(commands: Any, strategies: Sequence[str]) -> None:
    """convert: a TFJob manifest to the StrategyJob it becomes."""
    convert = commands.add_parser(
        "convert",
        help="print the StrategyJob equivalent of a Kubeflow TFJob manifest",
        description=(
            "Print the StrategyJob that a Kubeflow kubeflow.org/v1 TFJob manifest becomes: the "
            "strategy inferred from its replicas (ps: ParameterServerStrategy; several chief "
            "and worker replicas: MultiWorkerMirroredStrategy; one: MirroredStrategy), every "
            "field carried over, and one line on stderr for each field a StrategyJob cannot "
            "hold. Exits 2 if FILE is not a valid TFJob or its replicas do not fit the strategy."
        ),
    )
    convert.add_argument("manifest", metavar="FILE", help="the TFJob manifest (YAML; - is stdin)")
    convert.add_argument(
        "--strategy", choices=strategies, metavar="NAME", help="the strategy (default: inferred)"
    )
    convert.add_argument(
        "-o", "--output", metavar="FILE", help="write the StrategyJob here (default: stdout)"
    )
    convert.set_defaults(handler=_convert)


def _add_cluster_commands(commands: Any) -> None:
    """The commands that talk to a cluster, each with the kubeconfig options."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-n", "--namespace", help="the namespace (default: the kubeconfig context's)"
    )
    common.add_argument(
        "--kubeconfig", help="the kubeconfig (default: $KUBECONFIG, ~/.kube/config)"
    )
    common.add_argument("--context", help="the kubeconfig context (default: the current one)")

    _add_job_commands(commands, common)
    _add_training_commands(commands, common)

    delete = commands.add_parser(
        "delete", parents=[common], help="delete a StrategyJob (its pods go with it)"
    )
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(handler=_delete)


def _add_job_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """submit, list, status and logs: a job's life on the cluster."""
    submit = commands.add_parser(
        "submit",
        parents=[common],
        help="create a StrategyJob (or Kubeflow TFJob) on the cluster from a manifest",
        description=(
            "Create the StrategyJob of FILE (- reads stdin); the API server checks it. A "
            "Kubeflow TFJob is created as it is, as a TFJob, where the cluster serves them "
            "(the chart's tfjob.enabled=true)."
        ),
    )
    submit.add_argument("manifest", metavar="FILE", help="the StrategyJob or TFJob manifest (YAML)")
    submit.set_defaults(handler=_submit)

    list_ = commands.add_parser("list", parents=[common], help="list the namespace's StrategyJobs")
    list_.set_defaults(handler=_list)

    status = commands.add_parser(
        "status",
        parents=[common],
        help="show a job's state, replicas, progress and conditions",
        description=(
            "Show a job's state, progress, replicas (phase, restarts) and conditions. With "
            "--watch, redraw until the job finishes (exit 0 if it succeeded, 1 if it "
            "failed) or Ctrl-C."
        ),
    )
    status.add_argument("name", metavar="NAME")
    status.add_argument("-w", "--watch", action="store_true", help="redraw until it finishes")
    status.add_argument(
        "--interval",
        type=seconds,
        default=2.0,
        metavar="SECONDS",
        help="time between redraws with --watch (default: 2)",
    )
    status.set_defaults(handler=_status)

    logs = commands.add_parser(
        "logs",
        parents=[common],
        help="print a job's logs, all replicas prefixed, or one replica's",
        description=(
            "Print the logs of every replica, interleaved in time with [worker-1] prefixes, "
            "or of one replica with --replica."
        ),
    )
    logs.add_argument("name", metavar="NAME")
    logs.add_argument("--replica", metavar="TYPE-INDEX", help="one replica, e.g. worker-1")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until the containers end"
    )
    logs.set_defaults(handler=_logs)


def _add_training_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """scale, metrics and tensorboard: what a running job does and reports."""
    scale = commands.add_parser(
        "scale",
        parents=[common],
        help="resize a running job's workers",
        description=(
            "Ask for N workers, as kubectl scale sjob/NAME --replicas=N does: the workers of a "
            "ParameterServerStrategy job join and leave while it trains, with no restart; a "
            "MultiWorkerMirroredStrategy or TPUStrategy job is re-formed at the new size from "
            "its checkpoint (bounded by the worker spec's minReplicas and maxReplicas). With "
            "--local, the job "
            "strategyjob run runs on this machine: new worker processes start, removed ones "
            "stop, and the line the launcher says is printed."
        ),
    )
    scale.add_argument("name", metavar="NAME")
    scale.add_argument("--replicas", type=int, required=True, metavar="N", help="workers")
    scale.add_argument(
        "--local", action="store_true", help="the job strategyjob run runs on this machine"
    )
    scale.set_defaults(handler=_scale)

    metrics = commands.add_parser(
        "metrics",
        parents=[common],
        help="print the metric history a job reported",
        description=(
            "Print the history of the metrics a job reported with strategyjob.report, a row "
            "per step and a column per metric: a cluster job's (NAME: the history the "
            "operator keeps in its ConfigMap <job>-strategyjob-metrics), or the file "
            "strategyjob run --metrics FILE wrote (--file). Each metric keeps at most 1000 "
            "points over the whole run (its newest steps one by one, older ones evenly "
            "sampled). --plot draws them as curves."
        ),
    )
    metrics.add_argument("name", metavar="NAME", nargs="?", help="a job on the cluster")
    metrics.add_argument("--file", metavar="FILE", help="a history written by strategyjob run")
    shown = metrics.add_mutually_exclusive_group()
    shown.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    shown.add_argument(
        "--plot", action="store_true", help="draw each metric's curve instead of a table"
    )
    metrics.set_defaults(handler=_metrics)

    _add_tensorboard_command(commands, common)


def _run(args: argparse.Namespace) -> int:
    from strategyjob.launcher import RunOptions, run_file

    options = RunOptions(
        grace_period=args.grace_period,
        live_status=False if args.no_status else None,
        curves=args.curves,
        metrics_file=args.metrics,
    )
    return run_file(args.manifest, options)


def _metrics(args: argparse.Namespace) -> int:
    import csv

    from strategyjob._history import MetricHistory
    from strategyjob.client._curves import terminal_curves
    from strategyjob.client._format import metrics_rows, metrics_table

    if (args.name is None) == (args.file is None):
        print(
            "strategyjob metrics: name a job on the cluster (strategyjob metrics NAME) or a "
            "history file (strategyjob metrics --file FILE), one of the two.",
            file=sys.stderr,
        )
        return 2
    where = args.file
    if args.name is not None:
        with _client(args) as client:
            series = client.metrics(args.name)
        where = f"the history of StrategyJob {args.name} (none reported yet)"
    else:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except OSError as e:
            print(f"strategyjob metrics: cannot read {where}: {e.strerror or e}", file=sys.stderr)
            return 2
        try:
            series = MetricHistory.from_json(text).series()
        except ValueError as e:
            print(f"strategyjob metrics: {where}: {e}", file=sys.stderr)
            return 2
    if args.csv:
        headers, rows = metrics_rows(series)
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow([h.lower() for h in headers])
        writer.writerows([[row[0], *(repr(v) if v != "" else "" for v in row[1:])] for row in rows])
    elif series and args.plot:
        print(terminal_curves(series, shutil.get_terminal_size().columns, height=8))
    elif series:
        print(metrics_table(series))
    else:
        print(f"No metric in {where}.", file=sys.stderr)
    return 0


def _tensorboard(args: argparse.Namespace) -> int:
    from strategyjob.client import _tensorboard as tb

    def refuse(text: str) -> int:
        print(f"strategyjob tensorboard: {text}", file=sys.stderr)
        return 2

    if args.name is None:
        if args.logdir is None or args.copy_to or args.copy_only:
            return refuse(
                "name a job on the cluster (strategyjob tensorboard NAME) or a local "
                "directory (strategyjob tensorboard --logdir DIR)."
            )
        if not Path(args.logdir).is_dir():
            return refuse(f"{args.logdir} is not a directory.")
        if (why := tb.missing()) is not None:
            return refuse(why)
        return tb.serve(Path(args.logdir), args.port, args.host)
    if not args.copy_only and (why := tb.missing()) is not None:
        return refuse(why + "; --copy-only copies the summaries without it")
    if args.every < 1:  # each copy is an exec of tar in the pod: not in a busy loop
        return refuse(f"--every must be 1 second or more (got {args.every:g}).")
    with _client(args) as client:
        into = Path(args.copy_to or tb.default_copy_dir(client.namespace, args.name))

        def refresh() -> None:
            try:
                client.copy_summaries(args.name, into, logdir=args.logdir)
            except StrategyJobError as e:  # the pod ended: TensorBoard keeps what was copied
                print(f"strategyjob tensorboard: {_one_line(str(e))}", file=sys.stderr, flush=True)

        try:
            done = client.copy_summaries(args.name, into, logdir=args.logdir)
            print(f"copied {len(done.files)} files of {done.logdir} in pod {done.pod} into {into}")
        except StrategyJobError as e:
            if args.copy_only or not any(into.rglob("*")):
                raise
            print(
                f"strategyjob tensorboard: {_one_line(str(e))}; serving the copy made earlier "
                f"in {into}",
                file=sys.stderr,
            )
        if args.copy_only:
            return 0
        return tb.serve(into, args.port, args.host, refresh=refresh, every=args.every)


def _scale(args: argparse.Namespace) -> int:
    if args.local:
        from strategyjob.launcher import request_resize

        ok, message = request_resize(args.name, args.replicas)
        print(
            message if ok else f"strategyjob scale: {message}",
            file=sys.stdout if ok else sys.stderr,
        )
        return 0 if ok else 1
    with _client(args) as client:
        job = client.scale(args.name, args.replicas)
    print(
        f"StrategyJob {job.name}: {args.replicas} workers asked for; they join as their pods "
        f"become Ready (strategyjob status {job.name}, kubectl get sjob {job.name} -o wide)"
    )
    return 0


def _client(args: argparse.Namespace) -> Any:
    from strategyjob.client import StrategyJobClient

    return StrategyJobClient(
        kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace
    )


def _read(path: str) -> tuple[object, str]:
    """``(the one YAML document of path, where it came from)``; ``-`` reads stdin."""
    from strategyjob.jobspec import ManifestError, read_manifest_file, read_manifest_text

    if path != "-":
        return read_manifest_file(path), path
    stream = getattr(sys.stdin, "buffer", None)  # bytes: decoded as a file would be
    try:
        text = stream.read().decode("utf-8") if stream is not None else sys.stdin.read()
    except (OSError, ValueError) as e:
        raise ManifestError(
            [f"stdin: cannot read the manifest ({e}). Pipe in UTF-8 YAML."], "stdin"
        ) from None
    return read_manifest_text(text, "stdin"), "stdin"


def _convert(args: argparse.Namespace) -> int:
    import yaml

    from strategyjob.jobspec import ManifestError, convert_tfjob

    document, source = _read(args.manifest)
    try:
        conversion = convert_tfjob(document, args.strategy)
    except ManifestError as e:
        raise ManifestError([f"{source}: {p}" for p in e.problems], source) from None
    text = yaml.safe_dump(conversion.manifest, sort_keys=False)
    for note in conversion.notes:
        print(f"strategyjob convert: {note}", file=sys.stderr)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as e:
            raise StrategyJobError(f"{args.output}: cannot write the StrategyJob ({e}).") from None
    else:
        sys.stdout.write(text)
    return 0


def _submit(args: argparse.Namespace) -> int:
    from strategyjob.jobspec import ManifestError, format_value, messages

    manifest, source = _read(args.manifest)
    if not isinstance(manifest, Mapping):
        # A list or a scalar: refused here, before connecting to a cluster for nothing.
        problem = messages.NOT_A_MANIFEST.format(value=format_value(manifest))
        raise ManifestError([f"{source}: {problem}"], source)
    with _client(args) as client:
        job = client.create(manifest, namespace=args.namespace)
    if job.raw.get("kind") == "TFJob":
        print(
            f"TFJob {job.name} created in namespace {job.namespace}. "
            f"Watch it: kubectl get tfjob {job.name} -n {job.namespace} --watch"
        )
        return 0
    print(
        f"StrategyJob {job.name} created in namespace {job.namespace}. "
        f"Watch it: strategyjob status {job.name} -n {job.namespace} --watch"
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    from strategyjob.client._format import jobs_table

    with _client(args) as client:
        jobs = client.list()
        namespace = client.namespace
    if not jobs:
        print(f"No StrategyJobs in namespace {namespace}.", file=sys.stderr)
        return 0
    print(jobs_table(jobs))
    return 0


def _status(args: argparse.Namespace) -> int:
    from strategyjob.client._format import status_report

    with _client(args) as client:
        redraw = args.watch and sys.stdout.isatty()
        last = None
        seen: object = None  # the progress the curves were drawn for
        drawn = ""
        while True:
            job = client.get(args.name)
            if redraw and job.progress and job.progress != seen:  # a new report: new points
                seen, drawn = job.progress, _drawn_history(client, args.name)
            report = status_report(job, client.replicas(args.name), curves=drawn)
            if redraw:
                sys.stdout.write("\x1b[H\x1b[2J" + report + "\n")  # home, clear screen
                sys.stdout.flush()
            elif report != last:
                print(report if last is None else "\n" + report, flush=True)
            last = report
            if not args.watch:
                return 0
            if job.finished:
                return 0 if job.state == "Succeeded" else 1
            time.sleep(max(args.interval, 0.1))


def _drawn_history(client: Any, name: str) -> str:
    """The job's metric history as curves fitting the terminal (``status --watch``); a
    history that cannot be read is one line there, never the end of the watch."""
    from strategyjob.client._curves import terminal_curves

    try:
        series = client.metrics(name)
    except ClusterError as e:
        return f"curves: {_one_line(str(e))}"
    return terminal_curves(series, shutil.get_terminal_size().columns) if series else ""


def _logs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.replica:
            out = client.logs(args.name, replica=args.replica, follow=args.follow)
            if isinstance(out, str):
                sys.stdout.write(out)
            else:
                for line in out:
                    print(line, flush=True)
            return 0
        failed, printed = set(), set()
        for line in client.iter_logs(args.name, follow=args.follow):
            if line.error:
                failed.add(line.replica)
                print(f"strategyjob logs: [{line.replica}] {line.text}", file=sys.stderr)
            else:
                printed.add(line.replica)
                print(f"[{line.replica}] {line.text}", flush=args.follow)
        return 1 if failed and not printed else 0


def _delete(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.delete(args.name)
        namespace = client.namespace
    print(f"StrategyJob {args.name} deleted from namespace {namespace}.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``strategyjob`` console script and ``python -m strategyjob``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (ClusterError, JobFailedError) as e:
        # The cluster refused, could not be reached, or the job failed: one line, no trace.
        print(f"strategyjob {args.command}: error: {_one_line(str(e))}", file=sys.stderr)
        return 1
    except StrategyJobError as e:
        # Bad input: one clear message per problem, nothing was started.
        for line in str(e).splitlines():
            print(f"strategyjob {args.command}: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`strategyjob logs NAME | head`): not an error of ours.
        sys.stdout = None  # type: ignore[assignment]  # no flush error at exit
        return 0


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    raise SystemExit(main())


def _add_tensorboard_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """tensorboard: its serving and copying options."""
    tensorboard = commands.add_parser(
        "tensorboard",
        parents=[common],
        help="serve TensorBoard over a job's summaries",
        description=(
            "Serve TensorBoard over the summaries a job writes with strategyjob.summary: a "
            "cluster job's (NAME: its leader's logdir, which its reports name, copied out of "
            "its pod into --copy-to and copied again every --every seconds while TensorBoard "
            "serves; the copy stays once the pods are gone), or a local directory (--logdir "
            "alone; strategyjob run prints its job's at the end). Needs TensorBoard: "
            "pip install 'strategyjob[tensorboard]'."
        ),
    )
    tensorboard.add_argument("name", metavar="NAME", nargs="?", help="a job on the cluster")
    tensorboard.add_argument(
        "--logdir",
        help="with NAME: the directory inside the leader's pod (default: the one it reported); "
        "without: a local directory",
    )
    tensorboard.add_argument(
        "--copy-to",
        metavar="DIR",
        help="where a cluster job's summaries are copied (default: "
        "~/.cache/strategyjob/summaries/NAMESPACE/NAME)",
    )
    tensorboard.add_argument(
        "--copy-only", action="store_true", help="copy a cluster job's summaries, serve nothing"
    )
    tensorboard.add_argument("--port", type=int, default=6006, help="TensorBoard's port (6006)")
    tensorboard.add_argument(
        "--host", default="localhost", help="the address TensorBoard listens on (localhost)"
    )
    tensorboard.add_argument(
        "--every",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="seconds between two copies while serving (30)",
    )
    tensorboard.set_defaults(handler=_tensorboard)
