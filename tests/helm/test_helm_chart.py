"""The chart, offline: lint, the CRDs' one source, the values schema, what each value renders,
and RBAC equal to the operator's API calls (operator_api_calls.py), in both watch modes."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_harness import CHART, Helm, find, only, rule_keys
from operator_api_calls import calls_for, gang_calls, tfjob_calls

from tests.support.control_plane import REPO_ROOT

pytestmark = pytest.mark.timeout(120)

FULLNAME = "sjob-strategyjob-operator"
NAMESPACED = ("--set", "watchNamespaces={team-a,team-b}")
TFJOB = ("--set", "tfjob.enabled=true")


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def env_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(docs)["env"]}


# --- lint, CRDs, packaging ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "values", [(), NAMESPACED, TFJOB], ids=["cluster-wide", "namespaced", "tfjob"]
)
def test_lint_is_clean_in_strict_mode(helm: Helm, values: tuple[str, ...]) -> None:
    out = helm.run("lint", "--strict", str(CHART), *values).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


#: CRDs of crds/ that the chart installs only on a value (tfjob.enabled), from optional-crds/:
#: Helm installs everything in a chart's crds/ folder, always.
OPTIONAL_CRDS = {"kubeflow.org_tfjobs.yaml": "tfjob.enabled"}


def chart_crd_path(name: str) -> str:
    """Where the chart carries the copy of crds/<name>."""
    return f"{'optional-crds' if name in OPTIONAL_CRDS else 'crds'}/{name}"


def test_chart_crds_are_byte_identical_to_the_repository_crds() -> None:
    """crds/ is the one source; the chart carries a copy (helm needs the files inside it), the
    optional ones in optional-crds/."""
    source = {p.name: p.read_bytes() for p in (REPO_ROOT / "crds").glob("*.yaml")}
    chart = {
        p.name: p.read_bytes()
        for folder in ("crds", "optional-crds")
        for p in (CHART / folder).glob("*.yaml")
    }
    assert source, "no CRDs in crds/"
    assert OPTIONAL_CRDS.keys() <= source.keys()
    assert {p.name for p in (CHART / "optional-crds").glob("*.yaml")} == OPTIONAL_CRDS.keys()
    differ = sorted(n for n in source.keys() | chart.keys() if source.get(n) != chart.get(n))
    assert not differ, (
        f"helm chart CRDs differ from crds/ in {differ}: run tools/sync-chart-crds.sh"
    )


def test_packaged_chart_carries_crds_schema_and_renders(helm: Helm, tmp_path: Path) -> None:
    helm.run("package", str(CHART), "--destination", str(tmp_path))
    (tgz,) = tmp_path.glob("strategyjob-operator-0.1.0.tgz")
    with tarfile.open(tgz) as tar:
        names = set(tar.getnames())
        for crd in (REPO_ROOT / "crds").glob("*.yaml"):
            member = tar.extractfile(f"strategyjob-operator/{chart_crd_path(crd.name)}")
            assert member is not None and member.read() == crd.read_bytes()
    assert "strategyjob-operator/values.schema.json" in names
    assert "strategyjob-operator/templates/NOTES.txt" in names
    crds = [
        d for f in (REPO_ROOT / "crds").glob("*.yaml") for d in yaml.safe_load_all(f.read_text())
    ]
    for sets, installed in (((), len(crds) - len(OPTIONAL_CRDS)), (TFJOB, len(crds))):
        out = helm.run("template", "sjob", str(tgz), "--include-crds", *sets).stdout
        kinds = [d["kind"] for d in yaml.safe_load_all(out) if d]
        assert kinds.count("CustomResourceDefinition") == installed and "Deployment" in kinds


# --- values schema -----------------------------------------------------------------------------

SCHEMA_ERRORS = [
    pytest.param(["replicaCount=0"], "at '/replicaCount': minimum", id="zero-replicas"),
    pytest.param(["replicas=2"], "additional properties 'replicas' not allowed", id="typo-top"),
    pytest.param(["image.tags=x"], "additional properties 'tags' not allowed", id="typo-nested"),
    pytest.param(["image.pullPolicy=Sometimes"], "at '/image/pullPolicy'", id="pull-policy"),
    pytest.param(["watchNamespaces=team-a"], "got string, want array", id="namespaces-string"),
    pytest.param(["watchNamespaces={Team_A}"], "does not match pattern", id="namespace-name"),
    pytest.param(["watchNamespaces={a,a}"], "at '/watchNamespaces'", id="namespaces-twice"),
    pytest.param(["metrics.port=70000"], "at '/metrics/port': maximum", id="port-range"),
    pytest.param(["operator.maxInFlight=0"], "at '/operator/maxInFlight'", id="in-flight"),
    pytest.param(["operator.resyncSeconds=-1"], "at '/operator/resyncSeconds'", id="resync"),
    pytest.param(
        ["operator.terminationGraceSeconds=-5"],
        "at '/operator/terminationGraceSeconds'",
        id="grace",
    ),
    pytest.param(["peering.priority=-1"], "at '/peering/priority'", id="priority"),
    pytest.param(["image.digest=latest"], "at '/image/digest'", id="digest"),
    pytest.param(["metrics.serviceMonitor.interval=often"], "interval", id="interval"),
    pytest.param(
        ["operator.gangScheduler=kueue"], "at '/operator/gangScheduler'", id="gang-scheduler"
    ),
]


@pytest.mark.parametrize(("sets", "message"), SCHEMA_ERRORS)
def test_schema_rejects_bad_values_naming_the_field(
    helm: Helm, sets: list[str], message: str
) -> None:
    args = [a for s in sets for a in ("--set", s)]
    proc = helm.run("template", "sjob", str(CHART), *args, check=False)
    assert proc.returncode != 0
    assert "don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


TEMPLATE_ERRORS = [
    pytest.param(
        ["peering.enabled=false"], "without peering every operator pod acts", id="no-peering-ha"
    ),
    pytest.param(["peering.priority=5"], "kopf pauses every peer", id="fixed-priority-ha"),
    pytest.param(["serviceAccount.create=false"], "serviceAccount.name must name", id="no-sa-name"),
    pytest.param(
        ["metrics.enabled=false", "metrics.serviceMonitor.enabled=true"],
        "needs metrics.enabled=true",
        id="monitor-without-metrics",
    ),
    pytest.param(
        ["metrics.serviceMonitor.enabled=true"],
        "does not serve monitoring.coreos.com/v1 ServiceMonitor",
        id="monitor-without-crd",
    ),
]


@pytest.mark.parametrize(("sets", "message"), TEMPLATE_ERRORS)
def test_contradictory_values_fail_with_the_fix(helm: Helm, sets: list[str], message: str) -> None:
    args = [a for s in sets for a in ("--set", s)]
    proc = helm.run("template", "sjob", str(CHART), *args, check=False)
    assert proc.returncode != 0
    assert "ERROR: " in proc.stderr and message in proc.stderr, proc.stderr


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of the properties of every closed (additionalProperties: false) object."""
    paths = set()
    if schema.get("additionalProperties") is False:
        for key, sub in schema.get("properties", {}).items():
            paths.add(prefix + key)
            paths |= _schema_paths(sub, f"{prefix}{key}.")
    return paths


def _values_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> set[str]:
    paths = set()
    for key, value in values.items():
        paths.add(prefix + key)
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and sub.get("additionalProperties") is False:
            paths |= _values_paths(value, sub, f"{prefix}{key}.")
    return paths


def test_values_yaml_and_schema_declare_the_same_keys() -> None:
    """values.yaml is the documentation: no key the schema allows is undocumented there, and
    no documented key is unknown to the schema."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    declared = _schema_paths(schema) - {"global"}  # helm's own key for parent charts
    documented = _values_paths(values, schema)
    assert declared == documented, {
        "in schema only": sorted(declared - documented),
        "in values.yaml only": sorted(documented - declared),
    }


# --- what the defaults render -------------------------------------------------------------------


def test_defaults_render_two_peered_hardened_operator_pods(helm: Helm) -> None:
    docs = helm.render()
    deploy = only(docs, "Deployment", name=FULLNAME, namespace="strategyjob-system")
    pod = deploy["spec"]["template"]["spec"]
    c = container(docs)
    assert deploy["spec"]["replicas"] == 2
    assert c["image"] == "strategyjob-operator:0.1.0" and c["imagePullPolicy"] == "IfNotPresent"
    # No --priority: kopf pauses peers that share the highest priority, so each pod draws a
    # random one (the operator's default when peering).
    assert c["command"] == ["python", "-m", "strategyjob_operator"]
    assert c["args"] == [
        "--all-namespaces",
        "--peering=strategyjob-operator",
        "--liveness=http://0.0.0.0:8081/healthz",
    ]
    env = env_of(docs)
    assert env["STRATEGYJOB_METRICS_PORT"] == "8080"
    assert env["STRATEGYJOB_MAX_IN_FLIGHT"] == "50"
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # kopf's peer identity
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "healthz": 8081}
    probe = c["livenessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "healthz"}
    # Pod security: non-root, RuntimeDefault seccomp, read-only root, no privileges at all.
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert {v["name"]: v for v in pod["volumes"]}["tmp"]["emptyDir"]
    sa = only(docs, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == FULLNAME
    peering = only(docs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "strategyjob-operator"
    assert not find(docs, "ServiceMonitor") and not find(docs, "KopfPeering")


def test_metrics_service_selects_the_operator_pods_on_the_metrics_port(helm: Helm) -> None:
    docs = helm.render()
    svc = only(docs, "Service", name=f"{FULLNAME}-metrics")
    pod_labels = only(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (port,) = svc["spec"]["ports"]
    assert port["port"] == 8080 and port["targetPort"] == "metrics"
    assert "metrics" in {p["name"] for p in container(docs)["ports"]}


def test_every_object_carries_the_release_labels(helm: Helm) -> None:
    for doc in helm.render(*NAMESPACED):
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "sjob", doc["kind"]
        assert labels["app.kubernetes.io/name"] == "strategyjob-operator", doc["kind"]
        assert labels["helm.sh/chart"] == "strategyjob-operator-0.1.0", doc["kind"]


def test_namespaced_mode_renders_a_role_binding_and_peering_per_namespace(helm: Helm) -> None:
    docs = helm.render(*NAMESPACED)
    assert container(docs)["args"][:2] == ["--namespace=team-a", "--namespace=team-b"]
    for ns in ("team-a", "team-b"):
        only(docs, "Role", name=FULLNAME, namespace=ns)
        binding = only(docs, "RoleBinding", name=FULLNAME, namespace=ns)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": FULLNAME,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": FULLNAME, "namespace": "strategyjob-system"}
        ]
        only(docs, "KopfPeering", name="strategyjob-operator", namespace=ns)
    assert not find(docs, "ClusterKopfPeering")
    assert not find(docs, "ClusterRole", name=FULLNAME)


def test_namespaced_mode_without_discovery_has_no_cluster_scoped_rbac(helm: Helm) -> None:
    docs = helm.render(
        *NAMESPACED, "--set", "rbac.discovery=false", "--set", "rbac.aggregateToDefaultRoles=false"
    )
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"}
    assert not [d["metadata"]["name"] for d in docs if d["kind"] in cluster_scoped]
    assert len(find(docs, "Role")) == 2


VALUE_CASES = [
    pytest.param(
        ["replicaCount=1", "peering.enabled=false"],
        lambda docs: (
            container(docs)["command"] == ["python", "-m", "strategyjob_operator"]
            and "--standalone" in container(docs)["args"]
            and not find(docs, "ClusterKopfPeering")
            and not any("peering" in a for a in container(docs)["args"])
        ),
        id="standalone",
    ),
    pytest.param(
        ["replicaCount=1", "peering.priority=0"],
        lambda docs: (
            container(docs)["command"] == ["python", "-m", "strategyjob_operator"]
            and "--priority=0" in container(docs)["args"]
        ),
        id="fixed-priority-zero",
    ),
    pytest.param(
        ["image.digest=sha256:" + "a" * 64, "image.tag=ignored"],
        lambda docs: container(docs)["image"] == "strategyjob-operator@sha256:" + "a" * 64,
        id="digest",
    ),
    pytest.param(
        ["image.repository=registry.example/sjob/operator", "image.tag=1.2.3"],
        lambda docs: container(docs)["image"] == "registry.example/sjob/operator:1.2.3",
        id="tag",
    ),
    pytest.param(
        ["metrics.enabled=false"],
        lambda docs: (
            env_of(docs)["STRATEGYJOB_METRICS_PORT"] == "0"
            and not find(docs, "Service")
            and [p["name"] for p in container(docs)["ports"]] == ["healthz"]
        ),
        id="metrics-off",
    ),
    pytest.param(
        [
            "metrics.port=9100",
            "operator.maxInFlight=7",
            "operator.livenessPort=9101",
            "operator.resyncSeconds=0",
            "operator.terminationGraceSeconds=120",
        ],
        lambda docs: (
            env_of(docs)["STRATEGYJOB_METRICS_PORT"] == "9100"
            and env_of(docs)["STRATEGYJOB_MAX_IN_FLIGHT"] == "7"
            and env_of(docs)["STRATEGYJOB_RESYNC_SECONDS"] == "0"
            and env_of(docs)["STRATEGYJOB_TERMINATION_GRACE_SECONDS"] == "120"
            and "--liveness=http://0.0.0.0:9101/healthz" in container(docs)["args"]
            and only(docs, "Service")["spec"]["ports"][0]["port"] == 9100
        ),
        id="ports-and-in-flight",
    ),
    pytest.param(
        ["operator.verbose=true"], lambda docs: "--verbose" in container(docs)["args"], id="verbose"
    ),
    pytest.param(
        ["livenessProbe.initialDelaySeconds=0"],
        lambda docs: container(docs)["livenessProbe"]["initialDelaySeconds"] == 0,
        id="zero-kept",
    ),
    pytest.param(
        ["livenessProbe.enabled=false"],
        lambda docs: (
            "livenessProbe" not in container(docs)
            and any(a.startswith("--liveness=") for a in container(docs)["args"])
        ),
        id="probe-off",
    ),
    pytest.param(
        ["serviceAccount.create=false", "serviceAccount.name=ops-sa"],
        lambda docs: (
            not find(docs, "ServiceAccount")
            and only(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
            == "ops-sa"
            and only(docs, "ClusterRoleBinding")["subjects"][0]["name"] == "ops-sa"
        ),
        id="existing-sa",
    ),
    pytest.param(
        ["rbac.create=false"],
        lambda docs: (
            not {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
            & {d["kind"] for d in docs}
        ),
        id="no-rbac",
    ),
    pytest.param(
        ["fullnameOverride=sjo"],
        lambda docs: (
            only(docs, "Deployment")["metadata"]["name"] == "sjo"
            and only(docs, "Service")["metadata"]["name"] == "sjo-metrics"
        ),
        id="fullname",
    ),
    pytest.param(
        [
            "nodeSelector.pool=ops",
            "tolerations[0].key=ops",
            "tolerations[0].operator=Exists",
            "priorityClassName=system-cluster-critical",
            "podAnnotations.team=ml",
        ],
        lambda docs: (
            (pod := only(docs, "Deployment")["spec"]["template"])["spec"]["nodeSelector"]
            == {"kubernetes.io/os": "linux", "pool": "ops"}
            and pod["spec"]["tolerations"] == [{"key": "ops", "operator": "Exists"}]
            and pod["spec"]["priorityClassName"] == "system-cluster-critical"
            and pod["metadata"]["annotations"] == {"team": "ml"}
        ),
        id="scheduling",
    ),
    pytest.param(
        ["operator.gangScheduler=volcano"],
        lambda docs: (
            env_of(docs)["STRATEGYJOB_GANG_SCHEDULER"] == "volcano"
            and ("scheduling.volcano.sh", "podgroups", "create", ())
            in rule_keys(only(docs, "ClusterRole", name=FULLNAME)["rules"])
            and {("", "resourcequotas", "list", ()), ("", "resourcequotas", "watch", ())}
            <= rule_keys(only(docs, "ClusterRole", name=FULLNAME)["rules"])
        ),
        id="gang-volcano",
    ),
    pytest.param(
        ["operator.gangScheduler=scheduler-plugins", "watchNamespaces={team-a,team-b}"],
        lambda docs: (
            env_of(docs)["STRATEGYJOB_GANG_SCHEDULER"] == "scheduler-plugins"
            and all(
                ("scheduling.x-k8s.io", "podgroups", "create", ())
                in rule_keys(only(docs, "Role", namespace=ns)["rules"])
                for ns in ("team-a", "team-b")
            )
        ),
        id="gang-scheduler-plugins-namespaced",
    ),
    pytest.param(
        [],
        lambda docs: (
            "STRATEGYJOB_GANG_SCHEDULER" not in env_of(docs)
            and not any(
                key[1] in ("podgroups", "resourcequotas")
                for key in rule_keys(only(docs, "ClusterRole", name=FULLNAME)["rules"])
            )
        ),
        id="gang-off-by-default",
    ),
    pytest.param(
        ["operator.extraEnv[0].name=HTTPS_PROXY", "operator.extraEnv[0].value=http://proxy:3128"],
        lambda docs: env_of(docs)["HTTPS_PROXY"] == "http://proxy:3128",
        id="extra-env",
    ),
]


@pytest.mark.parametrize(("sets", "check"), VALUE_CASES)
def test_each_value_reaches_the_rendered_objects(helm: Helm, sets: list[str], check: Any) -> None:
    docs = helm.render(*[a for s in sets for a in ("--set", s)])
    assert check(docs), yaml.safe_dump_all(docs)


def test_long_release_names_are_cut_to_valid_object_names(helm: Helm) -> None:
    release = "r" * 53  # the longest release name helm accepts
    docs = helm.render(*NAMESPACED, release=release)
    names = [d["metadata"]["name"] for d in docs if d["kind"] != "KopfPeering"]
    assert all(len(n) <= 63 and not n.endswith("-") for n in names), names
    for suffix in ("-metrics", "-view", "-edit", "-discovery"):  # suffixes survive the cut
        assert any(n.endswith(suffix) for n in names), (suffix, names)


def test_service_monitor_scrapes_the_metrics_service(helm: Helm) -> None:
    docs = helm.render(
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.labels.release=prometheus",
        "--api-versions",
        "monitoring.coreos.com/v1/ServiceMonitor",
    )
    monitor = only(docs, "ServiceMonitor")
    svc = only(docs, "Service", name=f"{FULLNAME}-metrics")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["strategyjob-system"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "30s"}
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}


@pytest.mark.parametrize(
    ("values", "namespace_flag"), [((), ""), (NAMESPACED, " -n team-a")], ids=["all", "scoped"]
)
def test_notes_give_the_next_commands(
    helm: Helm, values: tuple[str, ...], namespace_flag: str
) -> None:
    out = helm.run("install", "sjob", str(CHART), "--dry-run=client", "-n", "ops", *values).stdout
    notes = out.split("NOTES:", 1)[1]
    assert f"kubectl apply{namespace_flag} -f examples/digits_mwms/k8s.yaml" in notes
    assert f"kubectl get sjob{namespace_flag} -w" in notes
    assert "kubectl -n ops get pods -l app.kubernetes.io/instance=sjob" in notes
    assert "tfjobs" not in notes
    out = helm.run(
        "install", "sjob", str(CHART), "--dry-run=client", "-n", "ops", *values, *TFJOB
    ).stdout
    tfjob_notes = out.split("NOTES:", 1)[1]
    listing = f"kubectl get tfjobs{namespace_flag or ' -A'}\n"
    assert "It also serves Kubeflow TFJobs" in tfjob_notes and listing in tfjob_notes, tfjob_notes


# --- RBAC: exactly the operator's calls ----------------------------------------------------------


def expected_keys(calls: list[Any], peering: str = "strategyjob-operator") -> set[Any]:
    return {(c.group, c.resource, c.verb, (peering,) if c.own_peering_only else ()) for c in calls}


@pytest.mark.parametrize("discovery", [True, False], ids=["discovery", "no-discovery"])
def test_cluster_role_grants_exactly_the_operator_calls(helm: Helm, discovery: bool) -> None:
    docs = helm.render("--set", f"rbac.discovery={str(discovery).lower()}")
    role = only(docs, "ClusterRole", name=FULLNAME)
    want = expected_keys(calls_for("cluster-wide", discovery=discovery))
    got = rule_keys(role["rules"])
    assert got == want, {"granted, never called": got - want, "called, not granted": want - got}
    binding = only(docs, "ClusterRoleBinding", name=FULLNAME)
    assert binding["roleRef"]["name"] == FULLNAME
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": "strategyjob-system"}
    ]


def test_namespaced_roles_grant_exactly_the_operator_calls(helm: Helm) -> None:
    docs = helm.render(*NAMESPACED, "--set", "peering.name=team-peering")
    calls = calls_for("namespaced")
    want_ns = expected_keys([c for c in calls if c.scope == "watched"], "team-peering")
    want_cluster = expected_keys([c for c in calls if c.scope == "cluster"])
    for ns in ("team-a", "team-b"):
        got = rule_keys(only(docs, "Role", namespace=ns)["rules"])
        assert got == want_ns, {"granted, never called": got - want_ns, "missing": want_ns - got}
    discovery = only(docs, "ClusterRole", name=f"{FULLNAME}-discovery")
    assert rule_keys(discovery["rules"]) == want_cluster
    binding = only(docs, "ClusterRoleBinding", name=f"{FULLNAME}-discovery")
    assert binding["roleRef"]["name"] == f"{FULLNAME}-discovery"


def test_no_rule_uses_wildcards_and_user_roles_are_never_bound(helm: Helm) -> None:
    for values in ((), NAMESPACED):
        docs = helm.render(*values)
        for doc in find(docs, "ClusterRole") + find(docs, "Role"):
            for rule in doc["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[field], (doc["metadata"]["name"], rule)
        bound = {
            b["roleRef"]["name"]
            for b in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding")
        }
        assert not bound & {f"{FULLNAME}-view", f"{FULLNAME}-edit"}
        view = only(docs, "ClusterRole", name=f"{FULLNAME}-view")
        assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
        assert {k[2] for k in rule_keys(view["rules"])} == {"get", "list", "watch"}


@pytest.mark.parametrize(
    ("scheduler", "group"),
    [("volcano", "scheduling.volcano.sh"), ("scheduler-plugins", "scheduling.x-k8s.io")],
)
@pytest.mark.parametrize("values", [(), NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_a_gang_scheduler_adds_exactly_its_calls_to_the_rbac(
    helm: Helm, scheduler: str, group: str, values: tuple[str, ...]
) -> None:
    """With a gang scheduler the operator also makes :func:`gang_calls` (PodGroups, the
    namespace's ResourceQuotas): the chart adds exactly their rules, in each watch mode."""
    kind, where = ("Role", {"namespace": "team-a"}) if values else ("ClusterRole", {})
    base = rule_keys(only(helm.render(*values), kind, name=FULLNAME, **where)["rules"])
    docs = helm.render(*values, "--set", f"operator.gangScheduler={scheduler}")
    with_gang = rule_keys(only(docs, kind, name=FULLNAME, **where)["rules"])
    assert with_gang - base == {(x.group, x.resource, x.verb, ()) for x in gang_calls(group)}
    assert base <= with_gang


# --- tfjob.enabled: Kubeflow TFJobs served beside StrategyJobs ------------------------------------


def _tfjob_crds(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return find(docs, "CustomResourceDefinition", name="tfjobs.kubeflow.org")


@pytest.mark.parametrize("values", [(), NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_tfjobs_are_off_by_default(helm: Helm, values: tuple[str, ...]) -> None:
    docs = helm.render(*values)
    assert _tfjob_crds(docs) == []
    assert "STRATEGYJOB_SERVE_TFJOBS" not in env_of(docs)
    for doc in find(docs, "ClusterRole") + find(docs, "Role"):
        assert not [k for k in rule_keys(doc["rules"]) if k[0] == "kubeflow.org"], doc


def test_tfjob_enabled_installs_the_repository_crd_kept_on_uninstall(helm: Helm) -> None:
    """The rendered CRD is crds/kubeflow.org_tfjobs.yaml, with the release's labels and Helm's
    keep policy (deleting it would delete every TFJob), and the operator serves TFJobs."""
    docs = helm.render(*TFJOB)
    (crd,) = _tfjob_crds(docs)
    source = yaml.safe_load((REPO_ROOT / "crds" / "kubeflow.org_tfjobs.yaml").read_text())
    meta = crd["metadata"]
    assert meta.pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert meta.pop("labels")["app.kubernetes.io/instance"] == "sjob"
    assert crd == source
    assert env_of(docs)["STRATEGYJOB_SERVE_TFJOBS"] == "true"
    # Where the cluster has the CRD already (Kubeflow installed it): only the operator's side.
    docs = helm.render(*TFJOB, "--set", "tfjob.installCRD=false")
    assert _tfjob_crds(docs) == []
    assert env_of(docs)["STRATEGYJOB_SERVE_TFJOBS"] == "true"


@pytest.mark.parametrize("values", [(), NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_tfjob_enabled_adds_exactly_its_calls_to_the_rbac(
    helm: Helm, values: tuple[str, ...]
) -> None:
    kind, where = ("Role", {"namespace": "team-b"}) if values else ("ClusterRole", {})
    base = rule_keys(only(helm.render(*values), kind, name=FULLNAME, **where)["rules"])
    served = rule_keys(only(helm.render(*values, *TFJOB), kind, name=FULLNAME, **where)["rules"])
    assert served - base == {(x.group, x.resource, x.verb, ()) for x in tfjob_calls()}
    assert base <= served
    assert ("kubeflow.org", "tfjobs/status", "patch", ()) in served


def test_tfjob_schema_rejects_a_wrong_type_naming_the_field(helm: Helm) -> None:
    proc = helm.run("template", "sjob", str(CHART), "--set", "tfjob.enabled=yes", check=False)
    assert proc.returncode != 0 and "/tfjob/enabled" in proc.stderr, proc.stderr


def test_tfjob_cluster_domain_is_training_operators_setting(helm: Helm) -> None:
    """``tfjob.clusterDomain`` reaches the operator as training-operator's own variable; unset,
    none is set; a value no address could end with is refused at install, naming the field."""
    assert "CUSTOM_CLUSTER_DOMAIN" not in env_of(helm.render(*TFJOB))
    docs = helm.render(*TFJOB, "--set", "tfjob.clusterDomain=cluster.local")
    assert env_of(docs)["CUSTOM_CLUSTER_DOMAIN"] == "cluster.local"
    args = ("template", "sjob", str(CHART), *TFJOB, "--set", "tfjob.clusterDomain=.Cluster")
    proc = helm.run(*args, check=False)
    assert proc.returncode != 0 and "/tfjob/clusterDomain" in proc.stderr, proc.stderr
