"""TPUStrategy on real processes over gloo (one process per device, TF_CONFIG from 127.0.0.1):
4 processes as 2 replicas x 2 logical devices, and as 1 replica x 4; 6 as 1 replica x 6 (a
mesh of (2, 3)); plus local mode."""

from __future__ import annotations

import pytest
from strategyjob.strategies.tpu import TPUStrategy, TPUStrategyV1

from ._cluster import WORKER, results, run_cluster

pytestmark = pytest.mark.multiprocess

CLUSTER_SECONDS = 200  # one cluster run; about 35 s alone on 2 cores, more when they are shared
FIXTURES_SECONDS = 2 * CLUSTER_SECONDS + 30  # the first test waits for both clusters


@pytest.fixture(scope="module")
def two_by_two() -> list[dict]:
    return results(run_cluster(WORKER, ["model", "2"], num_tasks=4, timeout=CLUSTER_SECONDS))


@pytest.fixture(scope="module")
def one_by_four() -> list[dict]:
    return results(run_cluster(WORKER, ["model", "4"], num_tasks=4, timeout=CLUSTER_SECONDS))


@pytest.mark.timeout(FIXTURES_SECONDS)
def test_mesh_is_replica_by_logical_device(two_by_two, one_by_four):
    for runs, replicas, cores in ((two_by_two, 2, 2), (one_by_four, 1, 4)):
        for rank, r in enumerate(runs):
            assert r["num_replicas_in_sync"] == replicas  # replicas, not devices
            assert r["num_cores_per_replica"] == cores
            assert r["mesh_dims"] == ["replica", "logical"]
            assert (r["replica"], r["core"]) == divmod(rank, cores)
    assert two_by_two[0]["mesh"] == [[0, 1], [2, 3]]
    assert one_by_four[0]["mesh"] == [[0, 1, 2, 3]]


@pytest.mark.timeout(FIXTURES_SECONDS)
def test_split_layer_matches_the_unsplit_model(two_by_two, one_by_four):
    """Outputs, the loss, every gradient and the trained parameters equal those of the unsplit
    model on the global batch on one device, for two steps."""
    for r in two_by_two + one_by_four:
        assert r["checks"] == {
            "pred": [True, True],
            "loss": [True, True],
            "weight_grad": [True, True],
            "bias_grad": [True, True],
            "head_grad": [True, True],
        }, r["rank"]
        assert r["params_equal_reference"] is True


@pytest.mark.timeout(FIXTURES_SECONDS)
def test_split_places_tiles_on_logical_devices(two_by_two, one_by_four):
    for r in two_by_two + one_by_four:
        p = r["placements"]
        dims = r["meshes"]["mesh_shape"]  # L = 4: mesh (2, 2), both dimensions split features
        assert p["x_split"] == ["S(1)"] * len(dims)
        assert p["x_local"] == r["x_expected_local"]  # core k holds feature block k
        assert p["partial"] == ["P(sum)"] * len(dims)  # the matmul of two splits: partial sums
        assert p["h"] == ["R"] * len(dims)
        assert p["loss_is_dtensor"] is True  # composes with ordinary torch operations
        a = r["annotate"]
        assert a["split_full_equal"] is True  # full_tensor() is the logical value
    for r in one_by_four:  # [1, 2, 2, 1]: core 2a + b holds H block a x W block b
        assert r["split_2d"] == {
            "placements": ["S(1)", "S(2)"],
            "tile_equal": True,
            "full_equal": True,
            "grad_whole": True,
        }


@pytest.mark.timeout(FIXTURES_SECONDS)
def test_replicate_and_assign_place_tensors(two_by_two, one_by_four):
    for runs, cores in ((two_by_two, 2), (one_by_four, 4)):
        for r in runs:
            a = r["annotate"]
            replicated = ["R"] * len(r["meshes"]["mesh_shape"])
            assert a["rep_placements"] == replicated and a["rep_local_equal"] is True
            owner = r["replica"] * cores + cores - 1  # assigned to the last logical device
            assert a["assigned_mesh"] == [owner]
            if r["rank"] == owner:
                assert a["assigned_local_numel"] == 32 and a["assigned_local_equal"] is True
            else:
                assert a["assigned_local_numel"] == 0  # not materialised elsewhere
            assert r["assigned_logical_value"] is True  # run() returns the value everywhere


@pytest.mark.timeout(FIXTURES_SECONDS)
def test_gradients_flow_back_whole(two_by_two, one_by_four):
    for r in two_by_two + one_by_four:
        assert r["split_grad_whole"] is True
        assert r["replicate_grad_whole"] is True
        assert r["assign_grad_whole"] is True


@pytest.mark.timeout(FIXTURES_SECONDS)
def test_base_api_counts_replicas_not_devices(two_by_two, one_by_four):
    for r in two_by_two:
        assert r["local_results"] == [[float(r["replica"])]]
        assert r["gather"] == [0.0, 1.0]
        assert r["reduce_sum"] == [1.0]
        assert r["replica_id_in_sync_group"] == r["replica"]
        assert r["all_reduce"] == 2.0
        assert r["all_gather"] == [0.0, 1.0]
        rows = range(4 * r["replica"], 4 * r["replica"] + 4)  # the replica's half of each batch
        assert r["dataset"] == [
            [[[2.0 * i, 2.0 * i + 1] for i in rows]],
            [[[16.0 + 2.0 * i, 17.0 + 2.0 * i] for i in rows]],
        ]
        # one input pipeline per replica, shared by its logical devices
        assert r["from_function"] == [[float(r["replica"]), 2.0, 2.0]]
    for r in one_by_four:
        assert r["from_function"] == [[0.0, 1.0, 1.0]]
        assert r["gather"] == [0.0] and r["reduce_sum"] == [0.0] and r["all_reduce"] == 1.0
        assert r["dataset"][0] == [[[float(2 * i), float(2 * i + 1)] for i in range(8)]]


def _failures(r: dict) -> dict:
    failed = {name: what for name, what in r["mixes"].items() if what}
    for key in ("shared_weight", "autograd_grad"):
        if r[key]:
            failed[key] = r[key]
    return failed


@pytest.mark.timeout(FIXTURES_SECONDS)
def test_every_mix_of_annotations_matches_the_unsplit_computation(two_by_two, one_by_four):
    """Split (every partition shape), replicated, assigned, unannotated and chained operands,
    pairwise through matmul, elementwise, nonlinear and matrix-vector operations: the value and
    both gradients (plain tensors, inside run) equal the unsplit computation on every device;
    a weight that meets an assigned and a split operand gets the sum of both gradients."""
    for r in two_by_two + one_by_four:
        assert _failures(r) == {}, r["rank"]
    assert len(two_by_two[0]["mixes"]) == 277 and len(one_by_four[0]["mixes"]) == 350
    # the case: a [2, 2] weight times a replicated operand (a cross-mesh error before)
    assert one_by_four[0]["mixes"]["matmul(rep,split[2, 2])"] == ""


@pytest.mark.timeout(FIXTURES_SECONDS)
def test_annotations_of_a_replica_share_one_mesh(two_by_two, one_by_four):
    for r in two_by_two:
        assert r["meshes"] == {
            "one_mesh": True,
            "mesh_shape": [2],
            "placements": {"[2, 1]": ["S(0)"], "[1, 2]": ["S(1)"], "rep": ["R"]},
        }
    for r in one_by_four:  # the prime factors of 4; tile k on core k (row-major) throughout
        assert r["meshes"] == {
            "one_mesh": True,
            "mesh_shape": [2, 2],
            "placements": {
                "[4, 1]": ["S(0)", "S(0)"],
                "[1, 4]": ["S(1)", "S(1)"],
                "[2, 2]": ["S(0)", "S(1)"],
                "rep": ["R", "R"],
            },
        }


@pytest.mark.timeout(CLUSTER_SECONDS + 30)
def test_splits_that_the_replica_mesh_cannot_express_still_combine():
    """L = 6: the replica's mesh is (2, 3); a [3, 2] split gets a mesh of its own and meets the
    others replicated."""
    runs = results(run_cluster(WORKER, ["mixed_radix", "6"], num_tasks=6, timeout=CLUSTER_SECONDS))
    for r in runs:
        assert _failures(r) == {}, r["rank"]
        assert r["meshes"]["one_mesh"] is True and r["meshes"]["mesh_shape"] == [2, 3]
    assert len(runs[0]["mixes"]) == 2 * (13 * 13 - 1)  # 13 operands, 2 operations


def _split_errors(cores: int) -> dict:
    return {
        "rank": "Length of `partition_dimensions` must equal to the rank of `tensor.shape` (2). "
        "Received len(partition_dimensions)=3.",
        "divisible": "Tensor shape at `partition_dimensions[1]` must be divisible by corresponding "
        "value specified by `partition_dimensions` (3). Received: 8.",
        "divisible_before_product": "Tensor shape at `partition_dimensions[0]` must be divisible "
        "by corresponding value specified by `partition_dimensions` (2). Received: 3.",
        "product": "The product of `partition_dimensions` should be the same as the number of "
        f"logical devices (={cores}). Received `partition_dimensions`=[3, 1],and their product "
        "is 3.",
        "assign_high": "`logical_core_id` to assign must be lower then total number of logical "
        f"devices per replica. Received logical device id {cores} but there are only total of "
        f"{cores} logical devices in replica.",
        "assign_negative": "`logical_core_id` to assign must be lower then total number of "
        "logical devices per replica. Received logical device id -1 but there are only total of "
        f"{cores} logical devices in replica.",
        "spmd_assign": "Cannot assign a tensor to a logical device in SPMD mode. To disable SPMD, "
        "Please construct the TPUStrategy with `experimental_spmd_xla_partitioning=False`",
    }


@pytest.mark.timeout(FIXTURES_SECONDS)
def test_validation_errors_and_order(two_by_two, one_by_four):
    for runs, cores in ((two_by_two, 2), (one_by_four, 4)):
        for r in runs:
            errors = r["errors"]
            for key, message in _split_errors(cores).items():
                assert errors[key] == message, key
            assert errors["rank_before_others"] == errors["rank"]
            assert errors["spmd_split_ok"] is True
    assert "uses 2 of the cluster's 4 devices" in two_by_two[0]["errors"]["partial_assignment"]


@pytest.mark.timeout(60)
def test_local_mode_without_tf_config():
    (r,) = results(run_cluster(WORKER, ["local"], num_tasks=1, timeout=45, tf_config=False))
    assert r["num_replicas_in_sync"] == 1 and r["num_cores_per_replica"] == 1
    assert r["doubled"] == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    assert r["assigned"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert r["reduce"] == r["doubled"]
    assert r["v1_numpy_dataset"] == 10  # the seed page's experimental.TPUStrategy method
    assert r["deepcopy_shares_mesh"] is True and r["deepcopy_runs"] is True
    assert r["product"].startswith("The product of `partition_dimensions` should be the same as")
    assert "Received logical device id 1 but there are only total of 1" in r["assign"]


def test_bad_arguments_fail_before_any_rendezvous():
    with pytest.raises(ValueError, match="tpu_cluster_resolver must be an instance of"):
        TPUStrategy(tpu_cluster_resolver="grpc://10.0.0.1:8470")
    with pytest.raises(ValueError, match=r"device_assignment must be a strategyjob\.tpu"):
        TPUStrategyV1(device_assignment=[[0, 1]])
