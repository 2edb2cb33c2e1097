"""The summary functions of ``tf.summary`` that training loops call: ``scalar``,
``histogram``, ``text``, with ``record_if``, ``should_record_summaries``, ``flush`` and the
default step (``experimental.get_step`` / ``set_step``).

Each returns True when it wrote, False when nothing was written: no default writer, a
``record_if`` condition that is false, a process or replica that does not write
(:mod:`._leader`). Bad data never stops training: a value that is not a scalar where one is
needed gives one warning per tag and is skipped; a NaN is written, as TensorFlow writes it.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from strategyjob.summary._leader import this_replica_writes
from strategyjob.summary._state import STATE, Condition
from strategyjob.summary._writer import SummaryWriter, _warn_once

#: TensorFlow's: "No step set. ..." when a writer is set but neither a step nor a default.
NO_STEP = (
    "No step set. Please specify one either through the `step` argument or through "
    "tf.summary.experimental.set_step()"
)
DEFAULT_BUCKETS = 30
# DataType values of TensorFlow's TensorProto (types.proto).
_DT_FLOAT, _DT_DOUBLE, _DT_STRING = 1, 2, 7


def set_step(step: Any) -> None:
    """``tf.summary.experimental.set_step``: the step of summaries that give none (an int,
    a 0-d tensor read when each summary is written, e.g. an optimizer's step counter, or
    None)."""
    STATE.step = step


def get_step() -> Any:
    """``tf.summary.experimental.get_step``: the default step, or None."""
    return STATE.step


@contextlib.contextmanager
def record_if(condition: Condition) -> Iterator[None]:
    """``tf.summary.record_if``: inside the block, summaries are written only while
    ``condition`` (a bool, or a callable evaluated at each summary) is true; the innermost
    block decides."""
    STATE.recording.append(condition)
    try:
        yield
    finally:
        STATE.recording.pop()


def should_record_summaries() -> bool:
    """``tf.summary.should_record_summaries``: whether a summary made here would be written
    (a default writer, the ``record_if`` condition, replica 0)."""
    if STATE.writer is None or not this_replica_writes():
        return False
    if not STATE.recording:
        return True
    condition = STATE.recording[-1]
    return bool(condition() if callable(condition) else condition)


def flush(writer: SummaryWriter | None = None, name: str | None = None) -> None:
    """``tf.summary.flush``: write what ``writer`` (default: the default writer) queued."""
    del name
    target = writer if writer is not None else STATE.writer
    if target is not None:
        target.flush()


def scalar(name: str, data: Any, step: Any = None, description: str | None = None) -> bool:
    """``tf.summary.scalar``: one number (a Python or NumPy number, a 0-d tensor) at
    ``step``, shown as a curve by TensorBoard's Scalars dashboard."""

    def value() -> Any:
        array = _as_array(data)
        if array is None or array.ndim != 0 or array.dtype.kind not in "biuf":
            shape = "?" if array is None else list(array.shape)
            _warn_once(
                ("scalar", name),
                f"strategyjob.summary.scalar({name!r}): the data must be a single number "
                f"(a 0-d tensor), got shape {shape} of {type(data).__name__}; not written. "
                "Reduce it first, e.g. loss.mean().",
            )
            return None
        return _tensor_value("scalars", description, _DT_FLOAT, [], float_val=[float(array)])

    return _write(name, value, step)


def histogram(
    name: str,
    data: Any,
    step: Any = None,
    buckets: int | None = None,
    description: str | None = None,
) -> bool:
    """``tf.summary.histogram``: the distribution of ``data``'s values over ``buckets``
    (30) equal-width buckets from its least to its greatest value, for TensorBoard's
    Histograms and Distributions dashboards. Non-finite values are left out, as there."""

    def value() -> Any:
        array = _as_array(data)
        if array is None or array.dtype.kind not in "biuf":
            _warn_once(
                ("histogram", name),
                f"strategyjob.summary.histogram({name!r}): the data must be numbers, got "
                f"{type(data).__name__}; not written.",
            )
            return None
        table = histogram_buckets(array, DEFAULT_BUCKETS if buckets is None else buckets)
        return _tensor_value(
            "histograms",
            description,
            _DT_DOUBLE,
            list(table.shape),
            double_val=table.ravel().tolist(),
        )

    return _write(name, value, step)


def text(name: str, data: Any, step: Any = None, description: str | None = None) -> bool:
    """``tf.summary.text``: a string (or a nest of strings, shown as a table), rendered as
    Markdown by TensorBoard's Text dashboard."""

    def value() -> Any:
        array = np.asarray(data, dtype=object)
        strings = [s.encode() if isinstance(s, str) else s for s in array.ravel().tolist()]
        if not all(isinstance(s, bytes) for s in strings):
            _warn_once(
                ("text", name),
                f"strategyjob.summary.text({name!r}): the data must be strings, got "
                f"{type(data).__name__}; not written.",
            )
            return None
        return _tensor_value("text", description, _DT_STRING, list(array.shape), string_val=strings)

    return _write(name, value, step)


def histogram_buckets(data: np.ndarray, bucket_count: int) -> np.ndarray:
    """``[bucket_count, 3]`` rows of (left edge, right edge, count), TensorBoard's
    histogram tensor: equal widths from the least to the greatest finite value; all in the
    last bucket, of zero width, when they are equal; zeros when there are none."""
    if bucket_count <= 0:
        raise ValueError(f"buckets must be a positive number (got {bucket_count})")
    values = data.astype(np.float64).ravel()
    values = values[np.isfinite(values)]
    table = np.zeros((bucket_count, 3))
    if values.size == 0:
        return table
    low, high = float(values.min()), float(values.max())
    if low == high:
        table[:, 0] = table[:, 1] = low
        table[-1, 2] = values.size
        return table
    edges = np.linspace(low, high, bucket_count + 1)
    index = np.minimum(
        ((values - low) / (high - low) * bucket_count).astype(np.int64), bucket_count - 1
    )
    table[:, 0], table[:, 1] = edges[:-1], edges[1:]
    table[:, 2] = np.bincount(index, minlength=bucket_count)
    return table


def _write(name: str, value: Callable[[], Any], step: Any) -> bool:
    writer = STATE.writer
    if writer is None or not should_record_summaries():
        return False
    at = _resolve_step(step)
    built = value()
    return built is not None and writer.write(name, built, at)


def _resolve_step(step: Any) -> int:
    chosen = STATE.step if step is None else step
    if chosen is None:
        raise ValueError(NO_STEP)
    number = _as_array(chosen)
    if number is None or number.ndim != 0 or number.dtype.kind not in "biuf":
        raise ValueError(f"step must be an integer (got {chosen!r})")
    as_float = float(number)
    if not math.isfinite(as_float):
        raise ValueError(f"step must be an integer (got {chosen!r})")
    return int(as_float)


def _as_array(data: Any) -> np.ndarray | None:
    """``data`` as a NumPy array without a copy where it can (a torch tensor is detached and
    brought to the CPU); None for what is not array-like."""
    if isinstance(data, (bool, numbers.Number, np.ndarray, np.generic, list, tuple)):
        try:
            return np.asarray(data)
        except (TypeError, ValueError):
            return None
    detach = getattr(data, "detach", None)
    if callable(detach):  # a torch tensor (or a Keras variable's value)
        return np.asarray(detach().cpu().numpy())
    numpy = getattr(data, "numpy", None)
    if callable(numpy):
        with contextlib.suppress(Exception):
            return np.asarray(numpy())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            array = np.asarray(data)
        except (TypeError, ValueError):
            return None
    return None if array.dtype == object else array


def _tensor_value(
    plugin: str, description: str | None, dtype: int, shape: list[int], **values: Any
) -> Any:
    """A ``Summary.Value`` holding a tensor, marked for TensorBoard plugin ``plugin`` (its
    tag is set by the writer)."""
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboardX.proto.tensor_pb2 import TensorProto
    from tensorboardX.proto.tensor_shape_pb2 import TensorShapeProto

    dims = [TensorShapeProto.Dim(size=n) for n in shape]
    tensor = TensorProto(dtype=dtype, tensor_shape=TensorShapeProto(dim=dims), **values)
    metadata = SummaryMetadata(
        plugin_data=SummaryMetadata.PluginData(plugin_name=plugin),
        summary_description=description or "",
    )
    return Summary.Value(tensor=tensor, metadata=metadata)
