"""``StrategyJob.build`` and ``build_manifest`` take one set of keywords, defined once
(``BuildOptions``): the same signature for ``help()``, the same TypeError for a wrong
keyword, the same static types for mypy, and the same manifest."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import pytest
from strategyjob.jobspec import BuildOptions, StrategyJob
from strategyjob.jobspec._model import BUILD_DEFAULTS
from strategyjob.jobspec._render import build_manifest

SDK = Path(__file__).resolve().parents[3] / "sdk"
CMD = ["python", "train.py"]
REQUIRED = {"strategy": "MultiWorkerMirroredStrategy", "image": "img", "command": CMD}


def test_build_and_build_manifest_accept_exactly_the_same_parameters() -> None:
    build = inspect.signature(StrategyJob.build)
    manifest = inspect.signature(build_manifest)
    assert build.parameters == manifest.parameters
    assert list(build.parameters) == ["name", *BuildOptions.__annotations__]
    assert [p.name for p in build.parameters.values() if p.default is p.empty] == [
        "name",
        "strategy",
        "image",
        "command",
    ]
    assert set(BUILD_DEFAULTS) <= set(BuildOptions.__optional_keys__)
    kinds = {p.kind for name, p in build.parameters.items() if name != "name"}
    assert kinds == {inspect.Parameter.KEYWORD_ONLY}


def test_help_shows_every_keyword_with_its_type_and_default() -> None:
    shown = str(inspect.signature(StrategyJob.build))
    assert shown.startswith("(name: str, *, strategy: str, image: str, command: ")
    assert "workers: int | None = None" in shown
    assert "evaluator: bool = False" in shown and "gpus_per_worker: int = 0" in shown
    assert StrategyJob.build.__doc__ and "common case" in StrategyJob.build.__doc__


@pytest.mark.parametrize(
    ("function", "name"),
    [(StrategyJob.build, "StrategyJob.build"), (build_manifest, "build_manifest")],
    ids=["build", "manifest"],
)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({**REQUIRED, "worker": 3}, "got an unexpected keyword argument 'worker'"),
        ({"strategy": "MirroredStrategy", "command": CMD}, "missing a required argument: 'image'"),
    ],
    ids=["unknown", "missing"],
)
def test_a_wrong_keyword_is_a_type_error_naming_the_function(
    function, name, kwargs, message
) -> None:
    with pytest.raises(TypeError) as info:
        function("x", **kwargs)
    assert str(info.value) == f"{name}() {message}; see help({name})"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"workers": 3, "evaluator": True, "gpus_per_worker": 1, "env": {"A": 1}},
        {
            "strategy": "ParameterServerStrategy",
            "ps": 2,
            "namespace": "ml",
            "restart_policy": "ExitCode",
            "resources": {"limits": {"cpu": "1"}},
            "backoff_limit": 0,
            "active_deadline_seconds": 5,
            "ttl_seconds_after_finished": 9,
            "clean_pod_policy": "All",
            "port": 2000,
            "labels": {"team": "a"},
            "annotations": {"note": "b"},
        },
        {"success_policy": "AllWorkers", "chief": True},
    ],
    ids=["defaults", "workers", "every-run-policy", "success-policy"],
)
def test_both_make_the_same_manifest(kwargs) -> None:
    options = {**REQUIRED, **kwargs}
    assert StrategyJob.build("same", **options).to_manifest() == build_manifest("same", **options)


def test_mypy_checks_the_keywords_of_both(tmp_path: Path, monkeypatch) -> None:
    api = pytest.importorskip("mypy.api")
    probe = tmp_path / "probe.py"
    probe.write_text(
        textwrap.dedent(
            """
            from strategyjob.jobspec import StrategyJob
            from strategyjob.jobspec._render import build_manifest

            S = "MirroredStrategy"
            StrategyJob.build("a", strategy=S, image="i", command=["p"], workers=2)
            build_manifest("a", strategy=S, image="i", command=["p"], workers=2)
            StrategyJob.build("a", strategy=S, image="i", command=["p"], workers="2")
            build_manifest("a", strategy=S, image="i", command=["p"], workers="2")
            StrategyJob.build("a", strategy=S, image="i", command=["p"], worker=2)
            build_manifest("a", strategy=S, image="i", command=["p"], worker=2)
            StrategyJob.build("a", strategy=S, command=["p"])
            build_manifest("a", strategy=S, command=["p"])
            """
        )
    )
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nstrict = True\n")
    monkeypatch.setenv("MYPYPATH", str(SDK))
    out, err, _ = api.run(
        ["--config-file", str(config), "--cache-dir", str(tmp_path / "cache"), str(probe)]
    )
    errors = sorted(
        (int(line.split(":")[1]), line.rsplit("[", 1)[-1].rstrip("]"))
        for line in out.splitlines()
        if ": error:" in line
    )
    assert errors == [
        (8, "arg-type"),
        (9, "arg-type"),
        (10, "call-arg"),
        (11, "call-arg"),
        (12, "call-arg"),
        (13, "call-arg"),
    ], out + err
