"""TFConfigClusterResolver and SimpleClusterResolver: the semantics document's §5.1 and §5.2
cases (TensorFlow's tfconfig_cluster_resolver_test.py) and the exact messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from strategyjob.cluster_resolver import (
    ClusterResolver,
    ClusterSpec,
    SimpleClusterResolver,
    TFConfigClusterResolver,
    TFConfigError,
)
from strategyjob.errors import StrategyJobError

CLUSTER = {
    "ps": ["ps0:2222", "ps1:2222"],
    "worker": ["worker0:2222", "worker1:2222", "worker2:2222"],
}


@pytest.fixture
def tf_config(monkeypatch):
    def set_config(config):
        text = config if isinstance(config, str) else json.dumps(config)
        monkeypatch.setenv("TF_CONFIG", text)

    monkeypatch.delenv("TF_CONFIG", raising=False)
    return set_config


# --- TFConfigClusterResolver -------------------------------------------------------------------


def test_cluster_spec_read(tf_config):
    tf_config({"cluster": CLUSTER, "task": {"type": "ps", "index": 0}})
    assert TFConfigClusterResolver().cluster_spec() == ClusterSpec(CLUSTER)


def test_automatic_master_read(tf_config):
    tf_config({"cluster": CLUSTER, "task": {"type": "ps", "index": 0}})
    assert TFConfigClusterResolver().master() == "ps0:2222"


def test_specified_task_type_and_index_master_read(tf_config):
    tf_config({"cluster": CLUSTER, "task": {"type": "ps", "index": 0}})
    assert TFConfigClusterResolver().master("worker", 1) == "worker1:2222"


def test_session_master_read(tf_config):
    tf_config(
        {
            "cluster": CLUSTER,
            "session_master": "sessionmaster:2222",
            "task": {"type": "ps", "index": 0},
        }
    )
    assert TFConfigClusterResolver().master() == "sessionmaster:2222"


def test_rpc_layer_read(tf_config):
    tf_config({"cluster": CLUSTER, "rpc_layer": "grpc", "task": {"type": "ps", "index": 0}})
    resolver = TFConfigClusterResolver()
    assert resolver.master() == "grpc://ps0:2222"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("ps", 0, "grpc")
    # An explicit empty rpc_layer argument gives the bare address.
    assert resolver.master(rpc_layer="") == "ps0:2222"


def test_parameter_overrides_and_setters(tf_config):
    tf_config({"cluster": CLUSTER, "rpc_layer": "grpc", "task": {"type": "ps", "index": 1}})
    resolver = TFConfigClusterResolver(task_type="ps", task_id=0)
    assert resolver.master() == "grpc://ps0:2222"
    assert (resolver.task_type, resolver.task_id) == ("ps", 0)

    resolver.task_type = "worker"
    resolver.task_id = 1
    resolver.rpc_layer = "test"
    assert resolver.master() == "test://worker1:2222"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "test")

    resolver.environment = "google"
    assert resolver.environment == "google"


def test_task_type_cast_to_string(tf_config):
    cluster = {"123456": CLUSTER["ps"], "worker": CLUSTER["worker"]}
    tf_config({"cluster": cluster, "rpc_layer": "grpc", "task": {"type": 123456, "index": 0}})
    assert TFConfigClusterResolver().task_type == "123456"


def test_task_index_cast_to_integer(tf_config):
    tf_config({"cluster": CLUSTER, "rpc_layer": "grpc", "task": {"type": "ps", "index": "1"}})
    assert TFConfigClusterResolver().task_id == 1


@pytest.mark.parametrize(
    ("index", "shown"),
    [
        ("abc", '"abc"'),
        ("", '""'),
        (1.5, "1.5"),
        (True, "true"),
        (-1, "-1"),
        ("-1", '"-1"'),
        (None, "null"),
        ([1], "[1]"),
    ],
)
def test_task_index_that_is_no_task_is_refused(tf_config, index, shown):
    """TensorFlow's ``int(index)`` takes ``"1"`` (above), raises its bare ``invalid literal``
    for ``"abc"`` and quietly makes ``1.5`` and ``true`` task 1, and ``-1`` the last task's
    address: each of these is one line naming TF_CONFIG here."""
    tf_config({"cluster": CLUSTER, "task": {"type": "worker", "index": index}})
    with pytest.raises(TFConfigError) as info:
        TFConfigClusterResolver().task_id  # noqa: B018
    assert str(info.value) == (
        f"TF_CONFIG task index must be a whole number, 0 or more (got {shown}). "
        'Write it as a JSON number, e.g. "task": {"type": "worker", "index": 1}.'
    )


def test_task_index_override(tf_config):
    tf_config(
        {"cluster": {"worker": CLUSTER["worker"][:2]}, "task": {"type": "worker", "index": "0"}}
    )
    assert TFConfigClusterResolver(task_id=1).task_id == 1
    assert TFConfigClusterResolver(task_id="1").task_id == 1  # type: ignore[arg-type]
    assert TFConfigClusterResolver(task_type=7).task_type == "7"  # type: ignore[arg-type]


def test_zero_items_in_cluster_master_read(tf_config):
    tf_config("{}")
    assert TFConfigClusterResolver().master() == ""


def test_one_item_in_cluster_master_read(tf_config):
    tf_config({"cluster": {"worker": ["worker0:2222"]}})
    assert TFConfigClusterResolver().master() == ""


def test_unset_tf_config_means_local(tf_config):
    resolver = TFConfigClusterResolver()
    assert not resolver.cluster_spec()
    assert resolver.cluster_spec() == ClusterSpec({})
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (None, None, None)
    assert resolver.master() == ""
    assert resolver.environment is None


def test_master_of_unknown_job(tf_config):
    tf_config({"cluster": CLUSTER})
    with pytest.raises(ValueError, match=r"^No such job in cluster: None$"):
        TFConfigClusterResolver().master()


def test_tf_config_is_reread_on_every_call(tf_config):
    resolver = TFConfigClusterResolver()
    tf_config({"cluster": CLUSTER, "task": {"type": "worker", "index": 2}})
    assert resolver.master() == "worker2:2222"
    tf_config({"cluster": CLUSTER, "task": {"type": "ps", "index": 1}})
    assert resolver.master() == "ps1:2222"
    assert resolver.cluster_spec().num_tasks("worker") == 3


def test_invalid_json_names_tf_config(tf_config):
    tf_config('{"cluster": {"worker": ["a:1"]')
    with pytest.raises(TFConfigError) as info:
        TFConfigClusterResolver().cluster_spec()
    message = str(info.value)
    assert message.startswith("TF_CONFIG is not valid JSON: Expecting ")
    assert "line 1 column" in message and "unset it to run locally" in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, StrategyJobError)


def test_tf_config_that_is_not_an_object(tf_config):
    tf_config("[1, 2]")
    with pytest.raises(TFConfigError, match=r"^TF_CONFIG must be a JSON object .*got a JSON list"):
        TFConfigClusterResolver().task_type  # noqa: B018


def test_num_accelerators_counts_only_own_task(tf_config):
    tf_config({"cluster": CLUSTER, "task": {"type": "worker", "index": 1}})
    resolver = TFConfigClusterResolver()
    own = resolver.num_accelerators()
    assert isinstance(own, dict)
    assert all(isinstance(v, int) and v > 0 for v in own.values())
    assert resolver.num_accelerators("worker", 1) == own
    assert resolver.num_accelerators("worker", 2) == {}


# --- SimpleClusterResolver ---------------------------------------------------------------------


def test_simple_resolver_master():
    spec = ClusterSpec(CLUSTER)
    resolver = SimpleClusterResolver(spec, master="grpc://sm:2222", task_type="worker", task_id=1)
    assert resolver.cluster_spec() is spec
    assert resolver.master() == "grpc://sm:2222"
    assert resolver.master("ps", 1) == "ps1:2222"
    assert resolver.master("ps", 1, rpc_layer="grpc") == "grpc://ps1:2222"
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)


def test_simple_resolver_empty_master_with_rpc_layer():
    resolver = SimpleClusterResolver(ClusterSpec({}), rpc_layer="grpc")
    assert resolver.master() == "grpc://"
    assert SimpleClusterResolver(ClusterSpec({})).master() == ""


def test_simple_resolver_defaults_and_setters():
    resolver = SimpleClusterResolver(ClusterSpec(CLUSTER), num_accelerators={"GPU": 4})
    assert resolver.num_accelerators() == {"GPU": 4}
    assert SimpleClusterResolver(ClusterSpec({})).num_accelerators() == {}
    assert resolver.environment == ""
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (None, None, None)
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "ps", 0, "grpc"
    assert resolver.master("ps", 0) == "grpc://ps0:2222"


def test_simple_resolver_type_errors():
    with pytest.raises(TypeError) as info:
        SimpleClusterResolver(CLUSTER)  # type: ignore[arg-type]
    assert str(info.value) == "cluster_spec must be a `tf.train.ClusterSpec`."
    with pytest.raises(TypeError) as info:
        SimpleClusterResolver(ClusterSpec({}), master=None)  # type: ignore[arg-type]
    assert str(info.value) == "master must be a string."


def test_cluster_resolver_is_abstract():
    with pytest.raises(TypeError):
        ClusterResolver()  # type: ignore[abstract]

    class Fixed(ClusterResolver):
        def cluster_spec(self):
            return ClusterSpec({"worker": ["a:1"]})

        def master(self, task_type=None, task_id=None, rpc_layer=None):
            return "a:1"

    fixed = Fixed()
    fixed.task_type = "worker"
    assert (fixed.task_type, fixed.task_id, fixed.environment) == ("worker", None, "")


def test_cluster_resolver_imports_no_torch():
    code = textwrap.dedent(
        """
        import sys
        from strategyjob.cluster_resolver import TFConfigClusterResolver, multi_worker_util
        r = TFConfigClusterResolver()
        assert r.master() == "b:1"
        assert multi_worker_util.id_in_cluster(r.cluster_spec(), r.task_type, r.task_id) == 1
        assert "torch" not in sys.modules
        """
    )
    config = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}
    env = {**os.environ, "TF_CONFIG": json.dumps(config)}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=env)
