"""``strategyjob.train``: checkpoints that survive preemption (``tf.train``'s checkpoint API).

``Checkpoint(**objects)`` saves and restores torch modules, optimizers, LR schedulers (anything
with ``state_dict``/``load_state_dict``), tensors, ``strategyjob.Variable``\\ s (mirrored,
sync-on-read and aggregating ones by their cross-replica value), ``ShardedVariable``\\ s (the
whole logical value, so it restores into any shard count), ``torch.Generator``\\ s and Python
numbers. ``save(prefix)`` writes ``prefix-N`` (``N`` = ``save_counter``), ``write(path)`` writes
exactly ``path``; ``restore``/``read`` return a status with ``assert_consumed()``,
``assert_existing_objects_matched()`` and ``expect_partial()``.

``CheckpointManager(checkpoint, directory, max_to_keep, ...)`` numbers checkpoints in a
directory, keeps the newest ``max_to_keep``, saves every ``checkpoint_interval`` steps of
``step_counter`` and restores the latest with ``restore_or_initialize()``;
``latest_checkpoint(directory)`` finds it without a manager::

    ckpt = strategyjob.train.Checkpoint(model=model, optimizer=opt, step=step)
    manager = strategyjob.train.CheckpointManager(ckpt, "/ckpt", max_to_keep=3)
    manager.restore_or_initialize()       # resumes after a restart
    for ...:
        train_step(); step += 1
        manager.save()

Why it survives preemption: every file is written to a temporary file in the same directory,
fsynced and renamed, and the state file listing the checkpoints is rewritten the same way after
the checkpoint is in place, so a process killed mid-save leaves the previous complete checkpoint
as the latest (the orphaned temporary file is removed by the chief's next save).

Under several workers (``MultiWorkerMirroredStrategy``): call ``save`` on every worker; only the
worker whose ``strategy.extended.should_checkpoint`` is true writes files, the others wait for
it (bounded by ``CommunicationOptions.timeout_seconds``) and raise if it failed. The strategy
is the one in scope, else the one the Checkpoint was created in, else the one its modules,
optimizers or variables belong to. Restoring reads the chief's files, so the directory must be
shared by all workers.

Preemption: ``strategyjob.experimental.PreemptionCheckpointHandler`` (``preemption.py``) saves
through a ``CheckpointManager`` at one step on every worker when any of them gets ``SIGTERM``,
exits 143 for a restart, and restores the latest checkpoint when created.

Under ParameterServerStrategy the chief's modules and variables are read from the ps when saved
and written back to them when restored. Under TPUStrategy, DTensors (state split over logical
devices) are saved whole and restored into each device's shard; optimizer state that lives on
the ps (momentum and the like) is read from the ps and written back to it.
"""

from strategyjob.strategies import base as _strategies  # noqa: F401  (the default strategy)
from strategyjob.train._storage import CheckpointState, get_checkpoint_state, latest_checkpoint
from strategyjob.train.checkpoint import (
    Checkpoint,
    CheckpointLoadStatus,
    InitializationOnlyStatus,
)
from strategyjob.train.checkpoint_manager import CheckpointManager

__all__ = [
    "Checkpoint",
    "CheckpointLoadStatus",
    "CheckpointManager",
    "CheckpointState",
    "InitializationOnlyStatus",
    "get_checkpoint_state",
    "latest_checkpoint",
]
