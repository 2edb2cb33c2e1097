"""Which process of a job writes summaries: the chief, else worker 0 (``should_checkpoint``'s
rule, :func:`strategyjob.cluster_resolver.multi_worker_util.is_chief`), and an evaluator (its
own). The others write nothing, so that a ``tf.summary`` loop ported unchanged leaves one
set of event files, not one per worker; within a process only replica 0 writes, as
TensorFlow's ``skip_summary`` has it for replica threads."""

from __future__ import annotations

import functools

# strategies.base registers the default strategy, which the replica context falls back to
import strategyjob.strategies.base  # noqa: F401
from strategyjob._context import get_replica_context
from strategyjob.cluster_resolver import TFConfigClusterResolver
from strategyjob.cluster_resolver.multi_worker_util import is_chief


@functools.cache
def this_process_writes() -> bool:
    """Whether this process's ``TF_CONFIG`` makes it the job's writer (True without one)."""
    resolver = TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    if not spec.as_dict() or resolver.task_type is None:
        return True
    return is_chief(spec, resolver.task_type, resolver.task_id or 0)


def this_replica_writes() -> bool:
    """False in a replica other than replica 0 (``strategy.run`` of a MirroredStrategy)."""
    context = get_replica_context()
    return context is None or int(context.replica_id_in_sync_group) == 0
