"""TPUStrategy's collectives across replicas follow replica order, also when the device
assignment numbers replicas against the process ranks (2 processes over gloo on 127.0.0.1):
gathers come back in replica order, reductions and averaged gradients agree, and the chief
(replica 0's device, task 1 here) broadcasts the initial parameters."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._cluster import results, run_cluster

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).resolve().parent / "replica_order_worker.py"
CLUSTER_SECONDS = 200  # about 15 s alone on 2 cores, more when they are shared


@pytest.mark.timeout(CLUSTER_SECONDS + 30)
def test_collectives_follow_replica_order_not_rank_order() -> None:
    by_rank = sorted(results(run_cluster(WORKER, [], 2, CLUSTER_SECONDS)), key=lambda r: r["rank"])
    assert [r["replica"] for r in by_rank] == [1, 0]
    assert [r["should_checkpoint"] for r in by_rank] == [False, True]
    chief_initial = by_rank[1]["initial"]
    assert by_rank[0]["initial"] != chief_initial  # the draws differ before the broadcast
    for r in by_rank:
        assert r["gathered"] == [0.0, 1.0, 1.0], r["rank"]  # uneven, in replica order
        assert r["gather"] == [0.0, 1.0], r["rank"]
        assert r["total"] == 1.0
        assert r["weight"] == chief_initial  # the chief's initial values (lr 0)
        assert r["grad"] == [[1.5, 1.5, 1.5]]  # the mean of inputs 1 and 2
