"""Cluster resolvers, as ``tf.distribute.cluster_resolver``: where the cluster is and
which task this process is. Torch-free (``num_accelerators`` imports torch lazily)."""

from strategyjob.cluster_resolver import multi_worker_util
from strategyjob.cluster_resolver._cluster_spec import ClusterSpec
from strategyjob.cluster_resolver._resolvers import (
    ClusterResolver,
    SimpleClusterResolver,
    TFConfigClusterResolver,
    TFConfigError,
    format_master_url,
    load_tf_config,
)

__all__ = [
    "ClusterResolver",
    "ClusterSpec",
    "SimpleClusterResolver",
    "TFConfigClusterResolver",
    "TFConfigError",
    "format_master_url",
    "load_tf_config",
    "multi_worker_util",
]
