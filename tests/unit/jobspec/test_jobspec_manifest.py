"""load_manifest: defaults, every validation rule and its exact message."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest
from strategyjob import jobspec
from strategyjob.errors import StrategyJobError
from strategyjob.jobspec import ManifestError, format_value, load_manifest, load_manifest_file
from strategyjob.jobspec import messages as msg


def problems_of(obj) -> list[str]:
    with pytest.raises(ManifestError) as info:
        load_manifest(obj)
    return info.value.problems


# --- defaults ----------------------------------------------------------------------------------


def test_minimal_manifest_gets_every_default(make_manifest):
    job = load_manifest(make_manifest())
    assert job.name == "mnist"
    assert job.namespace == "default"
    assert job.strategy == "MultiWorkerMirroredStrategy"
    assert job.port == 2222
    assert job.success_policy == ""
    assert job.run_policy == jobspec.RunPolicy(
        backoff_limit=6,
        active_deadline_seconds=None,
        ttl_seconds_after_finished=None,
        clean_pod_policy="Running",
        suspend=False,
        scheduling_policy=jobspec.SchedulingPolicy(None, None, None),
    )
    assert list(job.replica_specs) == ["worker"]
    assert job.replica_specs["worker"].replicas == 2
    assert job.replica_specs["worker"].restart_policy == "Never"


def test_replicas_default_to_one(make_manifest):
    obj = make_manifest()
    del obj["spec"]["replicaSpecs"]["worker"]["replicas"]
    assert load_manifest(obj).num_replicas("worker") == 1


def test_every_field_is_read(make_manifest):
    obj = make_manifest("ParameterServerStrategy", namespace="ml", chief=1, worker=3, ps=2)
    obj["metadata"]["labels"] = {"team": "vision"}
    obj["spec"]["replicaSpecs"]["worker"]["restartPolicy"] = "ExitCode"
    obj["spec"]["successPolicy"] = "AllWorkers"
    obj["spec"]["port"] = 3333
    obj["spec"]["runPolicy"] = {
        "backoffLimit": 2,
        "activeDeadlineSeconds": 600,
        "ttlSecondsAfterFinished": 0,
        "cleanPodPolicy": "All",
        "suspend": True,
        "schedulingPolicy": {"minAvailable": 6, "queue": "gpu", "priorityClass": "high"},
    }
    job = load_manifest(obj)
    assert job.namespace == "ml"
    assert job.labels == {"team": "vision"}
    assert job.replica_specs["worker"].restart_policy == "ExitCode"
    assert job.success_policy == "AllWorkers"
    assert job.port == 3333
    assert job.run_policy == jobspec.RunPolicy(
        2, 600, 0, "All", True, jobspec.SchedulingPolicy(6, "gpu", "high")
    )
    assert job.total_replicas == 6


def test_replica_types_are_ordered_chief_worker_ps_evaluator(make_manifest):
    obj = make_manifest("ParameterServerStrategy", evaluator=1, ps=1, worker=2, chief=1)
    job = load_manifest(obj)
    assert list(job.replica_specs) == ["chief", "worker", "ps", "evaluator"]
    assert job.replicas() == [
        ("chief", 0),
        ("worker", 0),
        ("worker", 1),
        ("ps", 0),
        ("evaluator", 0),
    ]
    assert job.pod_name("worker", 1) == "mnist-worker-1"


def test_job_is_frozen_and_template_is_a_private_copy(make_manifest):
    obj = make_manifest()
    job = load_manifest(obj)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.name = "other"  # type: ignore[misc]
    obj["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["image"] = "x"
    container = job.replica_specs["worker"].template["spec"]["containers"][0]
    assert container["image"] == "python:3.11"


def test_manifest_error_is_a_strategyjob_error():
    assert issubclass(ManifestError, StrategyJobError)


# --- topology per strategy ---------------------------------------------------------------------

VALID_TOPOLOGIES = [
    pytest.param("MultiWorkerMirroredStrategy", {"worker": 2}, id="mwms-2-workers"),
    pytest.param("MultiWorkerMirroredStrategy", {"chief": 1, "worker": 2}, id="mwms-chief"),
    pytest.param("MultiWorkerMirroredStrategy", {"worker": 1, "evaluator": 1}, id="mwms-eval"),
    pytest.param("ParameterServerStrategy", {"chief": 1, "worker": 2, "ps": 1}, id="ps"),
    pytest.param("MirroredStrategy", {"worker": 1}, id="mirrored-worker"),
    pytest.param("MirroredStrategy", {"chief": 1}, id="mirrored-chief"),
    pytest.param("CentralStorageStrategy", {"worker": 1, "evaluator": 1}, id="central-eval"),
    pytest.param("OneDeviceStrategy", {"worker": 1}, id="one-device"),
    pytest.param("TPUStrategy", {"worker": 4}, id="tpu"),
]


@pytest.mark.parametrize(("strategy", "counts"), VALID_TOPOLOGIES)
def test_valid_topologies_load(make_manifest, strategy, counts):
    job = load_manifest(make_manifest(strategy, **counts))
    assert {t: job.num_replicas(t) for t in counts} == counts


INVALID_TOPOLOGIES = [
    pytest.param(
        "MultiWorkerMirroredStrategy",
        {"worker": 2, "ps": 2},
        [msg.TAKES_NO_PS.format(strategy="MultiWorkerMirroredStrategy", value="2")],
        id="mwms-with-ps",
    ),
    pytest.param(
        "MultiWorkerMirroredStrategy",
        {"evaluator": 1},
        [
            msg.NEEDS_CHIEF_OR_WORKER.format(
                strategy="MultiWorkerMirroredStrategy", value=format_value({"evaluator": 1})
            )
        ],
        id="mwms-no-worker",
    ),
    pytest.param(
        "ParameterServerStrategy",
        {"worker": 2},
        [msg.PS_NEEDS_CHIEF.format(value="0"), msg.PS_NEEDS_PS.format(value="0")],
        id="ps-without-chief-and-ps",
    ),
    pytest.param(
        "ParameterServerStrategy",
        {"chief": 1, "ps": 1},
        [msg.PS_NEEDS_WORKER.format(value="0")],
        id="ps-without-worker",
    ),
    pytest.param(
        "ParameterServerStrategy",
        {"chief": 2, "worker": 1, "ps": 1},
        [msg.AT_MOST_ONE.format(replica_type="chief", value="2")],
        id="ps-two-chiefs",
    ),
    pytest.param(
        "MultiWorkerMirroredStrategy",
        {"worker": 2, "evaluator": 2},
        [msg.AT_MOST_ONE.format(replica_type="evaluator", value="2")],
        id="two-evaluators",
    ),
    pytest.param(
        "MirroredStrategy",
        {"worker": 2},
        [msg.SINGLE_PROCESS.format(strategy="MirroredStrategy", value='{"worker": 2}')],
        id="mirrored-two-workers",
    ),
    pytest.param(
        "CentralStorageStrategy",
        {"chief": 1, "worker": 1},
        [
            msg.SINGLE_PROCESS.format(
                strategy="CentralStorageStrategy", value='{"chief": 1, "worker": 1}'
            )
        ],
        id="central-chief-and-worker",
    ),
    pytest.param(
        "OneDeviceStrategy",
        {"worker": 1, "ps": 1},
        [msg.TAKES_NO_PS.format(strategy="OneDeviceStrategy", value="1")],
        id="one-device-with-ps",
    ),
    pytest.param(
        "OneDeviceStrategy",
        {"worker": 0},
        [msg.SINGLE_PROCESS.format(strategy="OneDeviceStrategy", value='{"worker": 0}')],
        id="one-device-zero-replicas",
    ),
    pytest.param(
        "TPUStrategy",
        {"chief": 1, "worker": 2, "ps": 1},
        [
            msg.TAKES_NO_PS.format(strategy="TPUStrategy", value="1"),
            msg.TPU_WORKERS_ONLY.format(value="1"),
        ],
        id="tpu-chief-and-ps",
    ),
]


@pytest.mark.parametrize(("strategy", "counts", "expected"), INVALID_TOPOLOGIES)
def test_invalid_topologies_name_the_field_and_the_fix(make_manifest, strategy, counts, expected):
    assert problems_of(make_manifest(strategy, **counts)) == expected


def test_topology_message_reads_as_documented(make_manifest):
    (problem,) = problems_of(make_manifest("MultiWorkerMirroredStrategy", worker=2, ps=2))
    assert problem == (
        "spec.replicaSpecs.ps: MultiWorkerMirroredStrategy takes no ps replicas (got 2). "
        "Remove spec.replicaSpecs.ps, or use ParameterServerStrategy."
    )


# --- fields ------------------------------------------------------------------------------------


def test_unknown_strategy(make_manifest):
    (problem,) = problems_of(make_manifest("MagicStrategy"))
    assert problem == msg.UNKNOWN_STRATEGY.format(
        value='"MagicStrategy"', allowed=", ".join(jobspec.STRATEGIES)
    )
    assert problem.startswith('spec.strategy: unknown strategy (got "MagicStrategy"). Use one')


def test_missing_strategy(make_manifest):
    obj = make_manifest()
    del obj["spec"]["strategy"]
    assert problems_of(obj) == [
        msg.MISSING_STRATEGY.format(value="null", allowed=", ".join(jobspec.STRATEGIES))
    ]


def test_api_version_and_kind(make_manifest):
    obj = make_manifest()
    obj["apiVersion"] = "kubeflow.org/v1"
    obj["kind"] = "TFJob"
    assert problems_of(obj) == [
        msg.BAD_API_VERSION.format(value='"kubeflow.org/v1"'),
        msg.BAD_KIND.format(value='"TFJob"'),
    ]


@pytest.mark.parametrize("bad", [None, [], "text", 3])
def test_not_a_mapping(bad):
    assert problems_of(bad) == [msg.NOT_A_MANIFEST.format(value=format_value(bad))]


def test_missing_spec(make_manifest):
    obj = make_manifest()
    del obj["spec"]
    obj["metadata"]["name"] = "Bad"
    assert problems_of(obj) == [
        msg.BAD_NAME.format(value='"Bad"'),
        msg.MISSING_SPEC.format(value="null"),
    ]


def test_unknown_top_level_field(make_manifest):
    obj = make_manifest()
    obj["specs"] = {}
    assert problems_of(obj) == [
        msg.UNKNOWN_FIELD.format(
            path="specs", value='"specs"', known="apiVersion, kind, metadata, spec, status"
        )
    ]


def test_template_that_is_not_a_mapping(make_manifest):
    obj = make_manifest()
    obj["spec"]["replicaSpecs"]["worker"]["template"] = ["containers"]
    assert problems_of(obj) == [
        msg.NOT_A_MAPPING.format(path="spec.replicaSpecs.worker.template", value='["containers"]')
    ]


@pytest.mark.parametrize(
    ("name", "template"),
    [
        pytest.param(None, msg.MISSING_NAME, id="missing"),
        pytest.param("", msg.MISSING_NAME, id="empty"),
        pytest.param("MNIST", msg.BAD_NAME, id="uppercase"),
        pytest.param("1mnist", msg.BAD_NAME, id="leading-digit"),
        pytest.param("mnist-", msg.BAD_NAME, id="trailing-dash"),
        pytest.param("mn_ist", msg.BAD_NAME, id="underscore"),
    ],
)
def test_bad_names(make_manifest, name, template):
    obj = make_manifest()
    obj["metadata"]["name"] = name
    assert problems_of(obj) == [template.format(value=format_value(name))]


def test_name_too_long_counts_the_longest_pod_name(make_manifest):
    # "-worker-10" is 10 characters: a 54-character name makes a 64-character pod name.
    name = "a" * 54
    obj = make_manifest(name=name, worker=11)
    (problem,) = problems_of(obj)
    assert problem == msg.NAME_TOO_LONG.format(
        pod_name=f"{name}-worker-10", length=64, value=f'"{name}"', max_length=53
    )
    assert load_manifest(make_manifest(name=name[:53], worker=11)).name == name[:53]
    assert load_manifest(make_manifest(name=name, worker=10)).name == name


def test_bad_namespace(make_manifest):
    assert problems_of(make_manifest(namespace="My_NS")) == [
        msg.BAD_NAMESPACE.format(value='"My_NS"')
    ]


def test_unknown_fields_are_reported_with_their_path(make_manifest):
    obj = make_manifest()
    obj["spec"]["replicaSpec"] = {}
    obj["spec"]["replicaSpecs"]["worker"]["replica"] = 3
    obj["spec"]["runPolicy"] = {"backofLimit": 3}
    problems = problems_of(obj)
    assert problems == [
        msg.UNKNOWN_FIELD.format(
            path="spec.replicaSpec",
            value='"replicaSpec"',
            known="strategy, replicaSpecs, runPolicy, successPolicy, port",
        ),
        msg.UNKNOWN_FIELD.format(
            path="spec.replicaSpecs.worker.replica",
            value='"replica"',
            known="replicas, minReplicas, maxReplicas, template, restartPolicy",
        ),
        msg.UNKNOWN_FIELD.format(
            path="spec.runPolicy.backofLimit",
            value='"backofLimit"',
            known="backoffLimit, activeDeadlineSeconds, pendingTimeoutSeconds, "
            "rendezvousTimeoutSeconds, ttlSecondsAfterFinished, cleanPodPolicy, suspend, "
            "schedulingPolicy",
        ),
    ]


def test_unknown_fields_of_a_pod_template_are_named_with_the_likely_one(make_manifest):
    """The CRD keeps a template's unknown fields and the API server drops them from the pod:
    ``comand:`` would run the image's entrypoint, so it is refused here, at every level."""
    obj = make_manifest()
    template = obj["spec"]["replicaSpecs"]["worker"]["template"]
    template["spec"]["containers"][0]["comand"] = ["python", "train.py"]
    template["spec"]["containers"][0]["gpus"] = 1
    template["spec"]["volume"] = []
    template["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox", "arg": ["x"]}]
    template["metdata"] = {}
    where = "spec.replicaSpecs.worker.template"
    tail = " Remove it or fix its name; kubectl explain {} lists the fields."
    assert problems_of(obj) == [
        f'{where}.metdata: unknown field of a Kubernetes pod template (got "metdata"). '
        "Did you mean metadata?" + tail.format("podtemplate.template"),
        f'{where}.spec.volume: unknown field of a Kubernetes pod spec (got "volume"). '
        "Did you mean volumes?" + tail.format("pod.spec"),
        f"{where}.spec.containers[0].comand: unknown field of a Kubernetes container (got "
        '"comand"). Did you mean command?' + tail.format("pod.spec.containers"),
        f"{where}.spec.containers[0].gpus: unknown field of a Kubernetes container (got "
        '"gpus").' + tail.format("pod.spec.containers"),
        f"{where}.spec.initContainers[0].arg: unknown field of a Kubernetes container (got "
        '"arg"). Did you mean args?' + tail.format("pod.spec.initContainers"),
    ]


def test_every_field_of_a_kubernetes_container_is_known(make_manifest):
    obj = make_manifest()
    template = obj["spec"]["replicaSpecs"]["worker"]["template"]
    template["spec"]["containers"][0].update(
        workingDir="/w", volumeMounts=[], imagePullPolicy="Always", tty=True, stdin=False
    )
    template["spec"].update(volumes=[], nodeSelector={}, tolerations=[], hostNetwork=False)
    template["metadata"] = {"labels": {"a": "b"}}
    assert load_manifest(obj).replica_specs["worker"].template == template


def test_a_tfjob_container_field_is_named_as_the_tfjob_writes_it():
    tfjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "mnist"},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "tensorflow", "image": "tf", "comand": ["python"]}
                            ]
                        }
                    },
                }
            }
        },
    }
    with pytest.raises(ManifestError) as info:
        jobspec.load_tfjob(tfjob)
    assert info.value.problems == [
        "spec.tfReplicaSpecs.Worker.template.spec.containers[0].comand: unknown field of a "
        'Kubernetes container (got "comand"). Did you mean command? Remove it or fix its name; '
        "kubectl explain pod.spec.containers lists the fields."
    ]


@pytest.mark.parametrize(
    ("image", "reason"),
    [
        (
            "Python:3.11",
            "invalid reference format: repository name (library/Python) must be lowercase",
        ),
        ("ghcr.io/Org/x:1", "invalid reference format: repository name (Org/x) must be lowercase"),
        ("python 3.11", "invalid reference format"),
        ("python:", "invalid reference format"),
        ("python:-rc", "invalid reference format"),
        ("python:3.11 ", "must not have leading or trailing whitespace"),
        (
            "a" * 64,
            f"invalid repository name ({'a' * 64}), cannot specify 64-byte hexadecimal strings",
        ),
        ("x@sha256:" + "A" * 64, "invalid checksum digest format"),
        ("x@sha256:" + "a" * 40, "invalid checksum digest format"),
        ("x@md5:" + "a" * 32, "unsupported digest algorithm"),
        ("x/" + "a" * 254, "repository name must not be more than 255 characters"),
    ],
)
def test_an_image_the_kubelet_cannot_parse_is_refused(make_manifest, image, reason):
    """The kubelet's reference grammar (distribution/reference) and its words: such a pod
    would wait in InvalidImageName for good, and strategyjob run would have run it."""
    obj = make_manifest()
    obj["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["image"] = image
    assert problems_of(obj) == [
        "spec.replicaSpecs.worker.template.spec.containers[0].image: not an image the cluster "
        f"can pull, its pods would wait in InvalidImageName ({reason}) (got "
        f"{format_value(image)}). Write [registry[:port]/]name[:tag][@sha256:digest], the "
        "name in lowercase, e.g. python:3.11."
    ]


@pytest.mark.parametrize(
    "image",
    [
        "python:3.11",
        "strategyjob-worker:dev",
        "localhost:5000/team/trainer:v1.2",
        "Registry.Example.com:5000/a/b",
        "[::1]:5000/x",
        "docker.io/library/python:3.11-slim@sha256:" + "0" * 64,
        "x@sha512:" + "f" * 128,
        "a__b/c-d--e.f",
    ],
)
def test_an_image_the_kubelet_parses_is_accepted(make_manifest, image):
    obj = make_manifest()
    obj["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["image"] = image
    assert load_manifest(obj).name == "mnist"


def test_status_and_server_metadata_are_accepted(make_manifest):
    obj = make_manifest()
    obj["status"] = {"conditions": []}
    obj["metadata"].update(uid="1234", resourceVersion="7", generation=2)
    assert load_manifest(obj).name == "mnist"


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        pytest.param("Worker", " (write 'worker' in lowercase)", id="capitalised"),
        pytest.param("master", " (a TFJob Master is a chief here)", id="tfjob-master"),
        pytest.param("trainer", "", id="unknown"),
    ],
)
def test_unknown_replica_type(make_manifest, make_replica, key, hint):
    obj = make_manifest()
    obj["spec"]["replicaSpecs"][key] = make_replica(1)
    assert problems_of(obj) == [
        msg.UNKNOWN_REPLICA_TYPE.format(replica_type=key, value=f'"{key}"', hint=hint)
    ]


@pytest.mark.parametrize("replica_specs", [None, {}])
def test_no_replicas(make_manifest, replica_specs):
    obj = make_manifest()
    obj["spec"]["replicaSpecs"] = replica_specs
    assert problems_of(obj) == [msg.MISSING_REPLICA_SPECS.format(value=format_value(replica_specs))]


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        pytest.param(
            ("replicaSpecs", "worker", "replicas"),
            "two",
            msg.NOT_AN_INTEGER.format(
                path="spec.replicaSpecs.worker.replicas", value='"two"', example=1
            ),
            id="replicas-string",
        ),
        pytest.param(
            ("replicaSpecs", "worker", "replicas"),
            True,
            msg.NOT_AN_INTEGER.format(
                path="spec.replicaSpecs.worker.replicas", value="true", example=1
            ),
            id="replicas-bool",
        ),
        pytest.param(
            ("replicaSpecs", "worker", "replicas"),
            -1,
            msg.INTEGER_TOO_SMALL.format(
                path="spec.replicaSpecs.worker.replicas", value="-1", minimum=0
            ),
            id="replicas-negative",
        ),
        pytest.param(
            ("replicaSpecs", "worker", "restartPolicy"),
            "Sometimes",
            msg.NOT_ONE_OF.format(
                path="spec.replicaSpecs.worker.restartPolicy",
                value='"Sometimes"',
                allowed="Never, OnFailure, Always, ExitCode",
            ),
            id="restart-policy",
        ),
        pytest.param(
            ("port",),
            70000,
            msg.INTEGER_TOO_LARGE.format(path="spec.port", value="70000", maximum=65535),
            id="port-too-large",
        ),
        pytest.param(
            ("port",),
            0,
            msg.INTEGER_TOO_SMALL.format(path="spec.port", value="0", minimum=1),
            id="port-zero",
        ),
        pytest.param(
            ("successPolicy",),
            "AnyWorker",
            msg.NOT_ONE_OF.format(
                path="spec.successPolicy", value='"AnyWorker"', allowed="'', AllWorkers"
            ),
            id="success-policy",
        ),
        pytest.param(
            ("runPolicy",),
            {"activeDeadlineSeconds": 0},
            msg.INTEGER_TOO_SMALL.format(
                path="spec.runPolicy.activeDeadlineSeconds", value="0", minimum=1
            ),
            id="deadline-zero",
        ),
        pytest.param(
            ("runPolicy",),
            {"ttlSecondsAfterFinished": -5},
            msg.INTEGER_TOO_SMALL.format(
                path="spec.runPolicy.ttlSecondsAfterFinished", value="-5", minimum=0
            ),
            id="ttl-negative",
        ),
        pytest.param(
            ("runPolicy",),
            {"cleanPodPolicy": "Some"},
            msg.NOT_ONE_OF.format(
                path="spec.runPolicy.cleanPodPolicy", value='"Some"', allowed="None, Running, All"
            ),
            id="clean-pod-policy",
        ),
        pytest.param(
            ("runPolicy",),
            {"suspend": "yes"},
            msg.NOT_A_BOOLEAN.format(path="spec.runPolicy.suspend", value='"yes"'),
            id="suspend-string",
        ),
        pytest.param(
            ("runPolicy",),
            {"schedulingPolicy": {"queue": 5}},
            msg.NOT_A_STRING.format(
                path="spec.runPolicy.schedulingPolicy.queue", value="5", example="default"
            ),
            id="queue-int",
        ),
        pytest.param(
            ("runPolicy",),
            {"schedulingPolicy": {"minAvailable": 3}},
            msg.MIN_AVAILABLE_TOO_LARGE.format(value="3", total=2),
            id="min-available-too-large",
        ),
        pytest.param(
            ("runPolicy",),
            ["backoffLimit"],
            msg.NOT_A_MAPPING.format(path="spec.runPolicy", value='["backoffLimit"]'),
            id="run-policy-list",
        ),
    ],
)
def test_field_errors(make_manifest, path, value, expected):
    obj = make_manifest()
    target = obj["spec"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert problems_of(obj) == [expected]


def test_template_errors(make_manifest):
    obj = make_manifest("ParameterServerStrategy", chief=1, worker=1, ps=1)
    specs = obj["spec"]["replicaSpecs"]
    del specs["chief"]["template"]
    specs["worker"]["template"] = {"spec": {"containers": []}}
    specs["ps"]["template"]["spec"]["containers"] = [{"image": "x"}]
    assert problems_of(obj) == [
        msg.MISSING_TEMPLATE.format(replica_type="chief", value="null"),
        msg.MISSING_CONTAINERS.format(replica_type="worker", value="[]"),
        msg.BAD_CONTAINER.format(
            path="spec.replicaSpecs.ps.template.spec.containers[0]", value='{"image": "x"}'
        ),
    ]


def test_every_problem_is_collected_in_one_error(make_manifest):
    obj = make_manifest("MultiWorkerMirroredStrategy", name="Bad_Name", worker=2, ps=1)
    obj["spec"]["port"] = "2222"
    obj["spec"]["runPolicy"] = {"backoffLimit": -1}
    with pytest.raises(ManifestError) as info:
        load_manifest(obj)
    assert len(info.value.problems) == 4
    assert str(info.value) == "\n".join(info.value.problems)
    assert [p.split(":")[0] for p in info.value.problems] == [
        "metadata.name",
        "spec.runPolicy.backoffLimit",
        "spec.port",
        "spec.replicaSpecs.ps",
    ]


def test_every_message_has_path_value_and_fix():
    templates = [v for k, v in vars(msg).items() if k.isupper() and isinstance(v, str)]
    assert len(templates) >= 30
    for template in templates:
        assert "(got {value})." in template, template
        head, _, fix = template.partition("(got {value}).")
        assert ": " in head and fix.strip(), template


def test_format_value_is_json_like_and_short():
    assert format_value("x") == '"x"'
    assert format_value(None) == "null"
    assert format_value({"b": 1, "a": [True]}) == '{"a": [true], "b": 1}'
    long = format_value("y" * 200)
    assert len(long) == 80 and long.endswith("...")


# --- files -------------------------------------------------------------------------------------

MANIFEST_YAML = """\
apiVersion: strategyjob.dev/v1alpha1
kind: StrategyJob
metadata:
  name: digits
spec:
  strategy: CentralStorageStrategy
  replicaSpecs:
    worker:
      replicas: 1
      template:
        spec:
          containers:
            - name: strategyjob
              command: ["python", "train.py"]
"""


def test_load_manifest_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(MANIFEST_YAML)
    job = load_manifest_file(path)
    assert (job.name, job.strategy, job.num_replicas("worker")) == (
        "digits",
        "CentralStorageStrategy",
        1,
    )


def test_file_problems_are_prefixed_with_the_path(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(MANIFEST_YAML.replace("CentralStorageStrategy", "Nope"))
    with pytest.raises(ManifestError) as info:
        load_manifest_file(path)
    assert info.value.problems == [
        f"{path}: "
        + msg.UNKNOWN_STRATEGY.format(value='"Nope"', allowed=", ".join(jobspec.STRATEGIES))
    ]


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ManifestError) as info:
        load_manifest_file(path)
    assert str(info.value) == f"{path}: no such file. Check the path of the StrategyJob manifest."


def test_invalid_yaml_names_line_and_column(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("apiVersion: [unclosed\nkind: StrategyJob\n")
    with pytest.raises(ManifestError) as info:
        load_manifest_file(path)
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}: invalid YAML at line ")
    assert problem.endswith("Fix the YAML syntax.")


def test_several_documents_are_refused(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(MANIFEST_YAML + "---\n" + MANIFEST_YAML)
    with pytest.raises(ManifestError, match=r"expected one YAML document .*\(got 2\)"):
        load_manifest_file(path)


def test_jobspec_imports_no_torch_kopf_or_kubernetes():
    code = textwrap.dedent(
        """
        import sys
        import strategyjob.jobspec
        bad = [m for m in ("torch", "kopf", "kubernetes") if m in sys.modules]
        assert not bad, bad
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
