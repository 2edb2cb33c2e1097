"""Where TPUStrategy puts a split (no processes): the replica's mesh has the prime factors of L
as dimensions, and a split lives on it whenever consecutive mesh dimensions can give tile ``k``
(row-major over ``partition_dimensions``) to logical core ``k``."""

from __future__ import annotations

import numpy as np
import pytest
from strategyjob.strategies.tpu import _prime_factors, _split_placements
from torch.distributed.tensor import Replicate, Shard


@pytest.mark.parametrize(
    ("n", "factors"),
    [(1, ()), (2, (2,)), (4, (2, 2)), (6, (2, 3)), (8, (2, 2, 2)), (12, (2, 2, 3)), (7, (7,))],
)
def test_prime_factors(n: int, factors: tuple[int, ...]) -> None:
    assert _prime_factors(n) == factors


S0, S1, S2 = Shard(0), Shard(1), Shard(2)


@pytest.mark.parametrize(
    ("mesh", "dims", "placements"),
    [
        ((2,), [1, 2], [S1]),
        ((2,), [2, 1], [S0]),
        ((2, 2), [4], [S0, S0]),
        ((2, 2), [1, 4], [S1, S1]),
        ((2, 2), [4, 1], [S0, S0]),
        ((2, 2), [2, 2], [S0, S1]),
        ((2, 2, 2), [1, 2, 4, 1], [S1, S2, S2]),  # TF's example: core 4a + b
        ((2, 2, 2), [4, 2], [S0, S0, S1]),
        ((2, 3), [2, 3], [S0, S1]),
        ((2, 3), [6, 1], [S0, S0]),
        ((2, 3), [6], [S0, S0]),
        ((2, 2, 3), [2, 6], [S0, S1, S1]),
        ((1,), [1, 1], [Replicate()]),
        ((2, 2), [1, 1], [Replicate(), Replicate()]),
    ],
)
def test_split_placements(mesh: tuple[int, ...], dims: list[int], placements: list) -> None:
    assert _split_placements(mesh, dims) == placements


@pytest.mark.parametrize(("mesh", "dims"), [((2, 3), [3, 2]), ((2, 2, 3), [3, 4])])
def test_split_placements_outside_the_mesh(mesh: tuple[int, ...], dims: list[int]) -> None:
    assert _split_placements(mesh, dims) is None  # such a split gets a mesh of its own


@pytest.mark.parametrize(
    ("mesh", "dims"),
    [((2, 2), [2, 2]), ((2, 2), [1, 4]), ((2, 2, 2), [1, 2, 4, 1]), ((2, 2, 3), [4, 3])],
)
def test_tile_k_lands_on_core_k(mesh: tuple[int, ...], dims: list[int]) -> None:
    """Nested shards (outer mesh dimension first) reproduce TF's arange(L).reshape(dims)."""
    placements = _split_placements(mesh, dims)
    tiles = np.arange(int(np.prod(dims))).reshape(dims)
    for core, coordinate in enumerate(np.ndindex(*mesh)):
        index = [0] * len(dims)
        pieces = [1] * len(dims)
        for size, c, placement in zip(mesh, coordinate, placements):
            index[placement.dim] = index[placement.dim] * size + c
            pieces[placement.dim] *= size
        assert pieces == dims
        assert tiles[tuple(index)] == core
