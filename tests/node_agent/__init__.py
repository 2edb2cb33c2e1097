"""A node agent that turns a bare control plane (kube-apiserver, scheduler, controllers)
into a working cluster for tests, on a machine without a container engine.

It registers Nodes, watches the pods the scheduler binds to them and runs each
container's command as a local process: in its own network namespace on a bridge (one
address per pod), with ``/etc/hosts`` naming every pod of a headless Service, the pod's
environment (downward API included), a service-account token mounted where in-cluster
clients look for it, restart policies, probes, graceful deletion and ``kubectl logs``.
The image is ignored: the host's Python stands in for it.

Modules: ``network`` (bridge, namespaces, veths), ``dns`` (hosts files),
``service_proxy`` (``kubernetes.default.svc:443`` to the API server), ``runtime`` (a
container as a process), ``pods`` (the pod worker), ``kubelet_api`` (logs), ``agent``
(Nodes, watch, shutdown; ``python -m node_agent``), ``harness`` (for tests: a control
plane plus the agent in a subprocess).

Not done: ``kubectl exec``/``port-forward``, Services' ClusterIPs (only the
``kubernetes`` Service is proxied; pods reach each other by pod IP and hosts-file names),
resource limits, security contexts (processes run as root), image pulls.
"""
