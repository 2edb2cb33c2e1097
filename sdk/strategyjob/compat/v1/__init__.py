"""``strategyjob.compat.v1``: mirrors ``tf.compat.v1.distribute.experimental``.

Only ``CentralStorageStrategy`` lives here; the compat.v1 methods it documents
(``experimental_run``, ``make_dataset_iterator``, ``make_input_fn_iterator``,
``update_config_proto``) are also on the v2 class, as in TensorFlow.
"""

from __future__ import annotations

from strategyjob.strategies.central_storage import (
    CentralStorageStrategyV1 as CentralStorageStrategy,
)

__all__ = ["CentralStorageStrategy"]
