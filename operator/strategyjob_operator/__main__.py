"""``python -m strategyjob_operator``: run the operator with kopf."""

from __future__ import annotations

import argparse
import logging
import random

import kopf

import strategyjob_operator  # noqa: F401  (registers the handlers)


def peering_priority(priority: int | None, *, standalone: bool) -> int:
    """The given priority, else a random one when peering: kopf pauses every peer that shares
    the highest priority, so the replicas of a Deployment must not tie."""
    if priority is not None:
        return priority
    return 0 if standalone else random.randrange(1, 2**31)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m strategyjob_operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering",
        default="strategyjob-operator",
        help="kopf peering object shared by the replicas",
    )
    peering.add_argument(
        "--standalone", action="store_true", help="no peering: for a single replica"
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority; the highest acts (default: a random one, so that replicas of "
        "a Deployment never tie: kopf pauses every peer sharing the highest priority)",
    )
    parser.add_argument("--liveness", default=None, help="e.g. http://0.0.0.0:8081/healthz")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    kopf.run(
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        priority=peering_priority(args.priority, standalone=args.standalone),
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
    )


if __name__ == "__main__":
    main()
