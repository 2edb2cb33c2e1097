"""A kind cluster made entirely on this machine (``tools/kind``) works as a Kubernetes cluster:
two nodes Ready, pods on different nodes reach each other, CoreDNS answers for a headless
Service, and kube-router enforces NetworkPolicy. The cluster (``tests.support.kind.kind_cluster``,
shared by every ``kind`` module of the session) is deleted afterwards, containers and Docker
network included, even when a test fails or the run is interrupted.
"""

from __future__ import annotations

import pytest

from tests.support.kind import Cluster, poll

# The first test also waits for the build (cold) and the cluster; each step has its own deadline.
pytestmark = [pytest.mark.kind, pytest.mark.timeout(3000)]
# A preloaded image with a shell, nc, nslookup and an HTTP server (busybox; its static wget
# crashes, so requests go through nc).
BUSYBOX = "strategyjob-local/local-path-helper:busybox-bookworm"
NAMESPACE = "kind-test"


@pytest.fixture(scope="module")
def cluster(kind_cluster: Cluster) -> Cluster:
    return kind_cluster


def _fetch(cluster: Cluster, pod: str, ip: str) -> bool:
    """Whether ``pod`` gets the web server's page from ``ip``."""
    request = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} 8080"
    ok, out = cluster.exec_ok(NAMESPACE, pod, "sh", "-c", request)
    return ok and "hello" in out


def test_every_node_is_ready(cluster: Cluster) -> None:
    nodes = cluster.get("nodes")["items"]
    assert len(nodes) == 2
    for node in nodes:
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True", node["metadata"]["name"]


def _pod(name: str, node: str, labels: dict[str, str], script: str) -> dict:
    """A busybox pod pinned to ``node`` (no scheduler involved), running ``script``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "nodeName": node,
            # web.server.NAMESPACE.svc.cluster.local, through the headless Service "server".
            "hostname": name,
            "subdomain": "server",
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def pods(cluster: Cluster) -> dict[str, str]:
    """An HTTP server on the control-plane node, two clients on the worker (one labelled as
    allowed by the NetworkPolicy below), a headless Service for the server. Returns pod IPs."""
    by_role = cluster.nodes_by_role()
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    serve = "mkdir -p /www && echo hello > /www/index.html && exec httpd -f -p 8080 -h /www"
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "server", "namespace": NAMESPACE},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "server"},
                "ports": [{"port": 8080}],
            },
        },
        _pod("web", by_role["control-plane"], {"app": "server"}, serve),
        _pod("plain", by_role["worker"], {"app": "client"}, "exec sleep 3600"),
        _pod("allowed", by_role["worker"], {"app": "client", "access": "web"}, "exec sleep 3600"),
    )
    cluster.kubectl(
        "-n", NAMESPACE, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=180s",
        timeout=200,
    )  # fmt: skip
    listed = cluster.get("-n", NAMESPACE, "pods")["items"]
    return {p["metadata"]["name"]: p["status"]["podIP"] for p in listed}


def test_pods_on_different_nodes_reach_each_other(cluster: Cluster, pods: dict[str, str]) -> None:
    poll(
        f"pod 'plain' (worker) reaching {pods['web']}:8080 on the control-plane node",
        lambda: _fetch(cluster, "plain", pods["web"]),
        120,
    )


def test_coredns_resolves_a_headless_service(cluster: Cluster, pods: dict[str, str]) -> None:
    cluster.kubectl(
        "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=240s",
        timeout=260,
    )  # fmt: skip
    name = f"web.server.{NAMESPACE}.svc.cluster.local"

    def resolved() -> bool:
        ok, out = cluster.exec_ok(NAMESPACE, "plain", "nslookup", name)
        return ok and pods["web"] in out

    poll(f"{name} resolving to {pods['web']}", resolved, 120)


def test_network_policy_refuses_an_unlabelled_pod_and_allows_a_labelled_one(
    cluster: Cluster, pods: dict[str, str]
) -> None:
    def connects(pod: str) -> bool:
        return _fetch(cluster, pod, pods["web"])

    poll("pod 'plain' reaching the server before any policy", lambda: connects("plain"), 120)
    cluster.apply(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "web-from-labelled", "namespace": NAMESPACE},
            "spec": {
                "podSelector": {"matchLabels": {"app": "server"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"access": "web"}}}]}],
            },
        }
    )
    refusals: list[bool] = []

    def refused_three_times_running() -> bool:
        refusals.append(not connects("plain"))
        return refusals[-3:] == [True, True, True]

    poll("the unlabelled pod refused by the NetworkPolicy", refused_three_times_running, 120)
    poll("the labelled pod allowed by the NetworkPolicy", lambda: connects("allowed"), 60)
