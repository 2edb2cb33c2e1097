"""``strategyjob.summary``: ``tf.summary`` for training loops, writing TensorBoard event
files.

A ``tf.summary`` loop ports by replacing ``tf.summary`` with ``strategyjob.summary``::

    writer = summary.create_file_writer("logs/train")
    with writer.as_default(step=step):
        summary.scalar("loss", loss)

In a job only the chief (else worker 0) and an evaluator write; the other workers' writers
write nothing, so one set of curves is kept, not one per worker. Within a process only
replica 0 of ``strategy.run`` writes, as in TensorFlow. Nothing a summary is given stops
training: bad data gives one warning per tag, an unwritable directory one warning.
"""

from __future__ import annotations

from strategyjob.summary import experimental
from strategyjob.summary._ops import (
    flush,
    histogram,
    record_if,
    scalar,
    should_record_summaries,
    text,
)
from strategyjob.summary._writer import SummaryWriter, create_file_writer, create_noop_writer

__all__ = [
    "SummaryWriter",
    "create_file_writer",
    "create_noop_writer",
    "experimental",
    "flush",
    "histogram",
    "record_if",
    "scalar",
    "should_record_summaries",
    "text",
]
