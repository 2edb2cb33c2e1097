"""The parameter-server strategy's machinery: gRPC transport and servers, partitioners,
``ShardedVariable`` and the ``ClusterCoordinator``.

Public names (re-exported by ``strategyjob`` / ``strategyjob.experimental``):
``strategyjob.ps.partitioners``, ``strategyjob.ps.coordinator``,
``strategyjob.ps.sharded_variable.ShardedVariable``, ``strategyjob.ps.server.Server``
(``strategyjob.runner``'s constructor sits above, with the strategies). The wire format is
``strategyjob_ps.proto``; its generated ``strategyjob_ps_pb2.py`` is committed (regenerate with
the command at the top of the proto).
"""
