"""Creation, called by the strategies' ``extended.create_variable``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strategyjob import _context, _devices, _values
from strategyjob._variables._aggregating import AggregatingVariable
from strategyjob._variables._common import (
    _MEAN_NON_FLOAT_MSG,
    _NONE_SYNC_MSG,
    VariableAggregation,
    VariableSynchronization,
    _initial_tensor,
    _validate_enums,
)
from strategyjob._variables._distributed import (
    _SCATTER_OPS,
    DistributedVariable,
    MirroredVariable,
    SyncOnReadVariable,
    _mirrored_scatter,
    _on_read_scatter,
)
from strategyjob._variables._plain import Variable, building_for

# ---------------------------------------------------------------------------------------------
# creation, called by the strategies' ``extended.create_variable``


def _base_name(name: str | None) -> str:
    base = name or "Variable"
    return base[:-2] if base.endswith(":0") else base


def create_plain_variable(
    strategy: Any,
    initial_value: Any,
    *,
    device: Any,
    trainable: bool | None = None,
    name: str | None = None,
    synchronization: Any = VariableSynchronization.AUTO,
    aggregation: Any = VariableAggregation.NONE,
) -> Variable:
    """A single-copy variable on ``device`` owned by ``strategy`` (OneDevice, one-device CSS)."""
    base = _base_name(name)
    synchronization, aggregation, trainable = _validate_enums(
        synchronization, aggregation, trainable, base
    )
    tensor = _initial_tensor(initial_value, None)
    with building_for(strategy):
        return Variable(
            tensor,
            trainable=trainable,
            name=base,
            synchronization=synchronization,
            aggregation=aggregation,
            device=device,
        )


def _in_replica_fn(strategy: Any) -> Any:
    """The replica context when variable creation happens inside ``strategy.run``."""
    ctx = _context.get_replica_context()
    if ctx is not None and getattr(ctx, "strategy", None) is strategy:
        return ctx
    return None


def create_distributed_variable(
    strategy: Any,
    initial_value: Any,
    *,
    trainable: bool | None = None,
    name: str | None = None,
    synchronization: Any = VariableSynchronization.AUTO,
    aggregation: Any = VariableAggregation.NONE,
) -> DistributedVariable:
    """A MirroredVariable (ON_WRITE/AUTO) or SyncOnReadVariable (ON_READ) over the local devices.

    The initial value is broadcast from the chief (``extended.collectives``) and every component
    starts as a copy of component 0. Called inside ``strategy.run``, the variable is created
    once (in a ``merge_call``) and shared by all replicas.
    """
    ctx = _in_replica_fn(strategy)
    if ctx is not None:
        return ctx.merge_call(
            lambda s: create_distributed_variable(
                s,
                initial_value,
                trainable=trainable,
                name=name,
                synchronization=synchronization,
                aggregation=aggregation,
            )
        )
    base = _base_name(name)
    synchronization, aggregation, trainable = _validate_enums(
        synchronization, aggregation, trainable, base
    )
    if synchronization == VariableSynchronization.NONE:
        raise ValueError(_NONE_SYNC_MSG.format(name=base))
    extended = strategy.extended
    tensor = _initial_tensor(initial_value, None)
    if aggregation == VariableAggregation.MEAN and not (
        tensor.is_floating_point() or tensor.is_complex()
    ):
        raise ValueError(_MEAN_NON_FLOAT_MSG)
    tensor = extended.collectives.broadcast_from_chief(tensor)
    devices = [_devices.canonicalize(d) for d in extended.topology.local_devices]
    components: list[Any] = []
    with building_for(strategy):
        for i, device in enumerate(devices):
            source = tensor if i == 0 else components[0].read_value()
            components.append(
                Variable(
                    source,
                    trainable=trainable,
                    name=base if i == 0 else f"{base}/replica_{i}",
                    synchronization=synchronization,
                    aggregation=aggregation,
                    device=device,
                )
            )
    kind = (
        SyncOnReadVariable
        if synchronization == VariableSynchronization.ON_READ
        else MirroredVariable
    )
    return kind(
        strategy,
        components,
        aggregation=aggregation,
        synchronization=synchronization,
        trainable=trainable,
    )


def create_aggregating_variable(
    strategy: Any,
    initial_value: Any,
    *,
    device: Any,
    trainable: bool | None = None,
    name: str | None = None,
    synchronization: Any = VariableSynchronization.AUTO,
    aggregation: Any = VariableAggregation.NONE,
) -> AggregatingVariable:
    """One variable on ``device`` wrapped so that replica updates aggregate (CentralStorage)."""
    ctx = _in_replica_fn(strategy)
    if ctx is not None:
        return ctx.merge_call(
            lambda s: create_aggregating_variable(
                s,
                initial_value,
                device=device,
                trainable=trainable,
                name=name,
                synchronization=synchronization,
                aggregation=aggregation,
            )
        )
    variable = create_plain_variable(
        strategy,
        initial_value,
        device=device,
        trainable=trainable,
        name=name,
        synchronization=synchronization,
        aggregation=aggregation,
    )
    return AggregatingVariable(strategy, variable, variable.aggregation)


def update_components(var: Any, fn: Callable[..., Any], args: tuple, kwargs: dict) -> list[Any]:
    """Run ``fn(component_i, *select_replica(i, args))`` on every component of ``var``.

    What ``StrategyExtended.update`` does for a distributed variable in cross-replica context;
    a plain or aggregating variable has the single component itself (its wrapped variable).
    """
    if isinstance(var, DistributedVariable):
        return [
            fn(c, *_values.select_replica(i, args), **_values.select_replica(i, kwargs))
            for i, c in enumerate(var.values)
        ]
    target = var.get() if isinstance(var, AggregatingVariable) else var
    return [fn(target, *args, **kwargs)]


for _name in _SCATTER_OPS:
    setattr(SyncOnReadVariable, _name, _on_read_scatter(_name))
    setattr(MirroredVariable, _name, _mirrored_scatter(_name))
    setattr(AggregatingVariable, _name, _mirrored_scatter(_name))
