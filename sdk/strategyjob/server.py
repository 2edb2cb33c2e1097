"""``python -m strategyjob.server``: serve this task of a ParameterServerStrategy cluster.

Reads ``TF_CONFIG`` (cluster and own task) and runs a :class:`strategyjob.Server` for it until
killed, so the worker and ps replicas of a StrategyJob need nothing but this command.
"""

from __future__ import annotations

import sys

__all__ = ["main"]  # and `Server`, loaded lazily


def __getattr__(name: str):  # lazy: importing this module must not start anything
    if name == "Server":
        from strategyjob.ps._server import Server

        return Server
    raise AttributeError(name)


def main() -> int:
    from strategyjob.cluster_resolver import TFConfigClusterResolver
    from strategyjob.ps._server import Server

    resolver = TFConfigClusterResolver()
    cluster = resolver.cluster_spec()
    if not cluster.jobs or resolver.task_type is None or resolver.task_id is None:
        print(
            "strategyjob.server: TF_CONFIG must name the cluster and this task, e.g. "
            '{"cluster": {"worker": ["host:port"], "ps": ["host:port"]}, '
            '"task": {"type": "worker", "index": 0}}',
            file=sys.stderr,
        )
        return 2
    server = Server(cluster, job_name=resolver.task_type, task_index=resolver.task_id, start=True)
    print(
        f"strategyjob.server: {server.target} serving /job:{resolver.task_type}/task:"
        f"{resolver.task_id}",
        flush=True,
    )
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
