"""The ``strategyjob`` command line. Subcommands: ``run`` (local launcher); later
issues add cluster commands (``submit``, ``list``, ...) as further subparsers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from strategyjob import __version__
from strategyjob.errors import StrategyJobError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strategyjob",
        description="Run tf.distribute-style training jobs on PyTorch, locally or on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"strategyjob {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    run = commands.add_parser(
        "run",
        help="run a StrategyJob manifest locally, one process per replica",
        description=(
            "Run a StrategyJob manifest on this machine: one process per replica, with "
            "TF_CONFIG and the torch rendezvous variables on 127.0.0.1. Exits 0 if the job "
            "succeeded, 1 if it failed, 2 if the manifest is invalid."
        ),
    )
    run.add_argument("manifest", metavar="FILE.yaml", help="the StrategyJob manifest")
    run.add_argument(
        "--grace-period",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="time between SIGTERM and SIGKILL when stopping replicas (default: 10)",
    )
    run.add_argument(
        "--no-status",
        action="store_true",
        help="do not show the live status line (it is shown only on a terminal anyway)",
    )
    run.set_defaults(handler=_run)
    return parser


def _run(args: argparse.Namespace) -> int:
    from strategyjob.launcher import RunOptions, run_file

    options = RunOptions(
        grace_period=args.grace_period, live_status=False if args.no_status else None
    )
    return run_file(args.manifest, options)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``strategyjob`` console script and ``python -m strategyjob``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except StrategyJobError as e:
        # Bad input: one clear message per problem, nothing was started.
        for line in str(e).splitlines():
            print(f"strategyjob {args.command}: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
