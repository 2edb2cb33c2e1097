"""Every code block of the documentation (docs/ and the README) is tested: run, or, where it
cannot run here, syntax-checked (tools/docs/snippets.py says how a block is marked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import child_env, run_in_session

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "docs"))
import snippets  # noqa: E402

ALL = [s for page in snippets.pages(ROOT) for s in snippets.snippets(page, ROOT)]
RUN = [s for s in ALL if s.kind == "run"]
CHECKED = [s for s in ALL if s.kind in ("fragment", "not-here")]


def test_every_block_says_how_it_is_tested() -> None:
    assert len(ALL) > 20
    unmarked = [s.where for s in ALL if s.kind not in snippets.KINDS]
    assert not unmarked, (
        f"code blocks with no <!-- snippet: run|fragment|not-here WHY --> line before them: "
        f"{unmarked} (tools/docs/snippets.py)"
    )
    unexplained = [s.where for s in ALL if s.kind == "not-here" and not s.why]
    assert not unexplained, f"not-here blocks that do not say why: {unexplained}"
    assert {s.language for s in RUN} == {"python", "shell"}


@pytest.mark.parametrize("snippet", CHECKED, ids=[s.where for s in CHECKED])
def test_a_block_that_cannot_run_here_parses(snippet: snippets.Snippet) -> None:
    if snippet.language == "python":
        compile(snippet.code, snippet.where, "exec")
    else:
        checked = subprocess.run(
            ["bash", "-n"], input=snippet.code, capture_output=True, text=True, timeout=30
        )
        assert checked.returncode == 0, f"{snippet.where}: {checked.stderr}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("snippet", RUN, ids=[s.where for s in RUN])
def test_a_runnable_block_runs(snippet: snippets.Snippet, tmp_path: Path) -> None:
    """Python in a fresh interpreter in an empty directory; shell in the repository root,
    as the page tells the reader to run it."""
    if snippet.language == "python":
        argv, cwd = [sys.executable, "-c", snippet.code], tmp_path
    else:
        argv, cwd = ["bash", "-e", "-c", snippet.code], ROOT
    outcome = run_in_session(argv, child_env(), timeout=200, cwd=cwd)
    assert not outcome.timed_out, f"{snippet.where} still ran after 200 s:\n{outcome.output}"
    assert outcome.returncode == 0, f"{snippet.where} failed:\n{outcome.output[-3000:]}"


def test_every_commands_help_names_its_documentation_page() -> None:
    """``strategyjob --help`` and each command's end with the page that explains it, and the
    page exists."""
    from strategyjob.cli import DOCS

    env = child_env(COLUMNS="200")
    for command in DOCS:
        argv = [sys.executable, "-m", "strategyjob", "--help"]
        if command != "strategyjob":
            argv.insert(3, command)
        shown = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        last = shown.stdout.strip().splitlines()[-1]
        assert last.startswith(f"Documentation: {DOCS[command]} "), (command, last)
        assert (ROOT / DOCS[command]).is_file(), DOCS[command]


def test_the_page_that_fault_messages_name_exists() -> None:
    from strategyjob import _names

    assert (ROOT / _names.DOCS_FAULTS).is_file()
    assert "STRATEGYJOB_STUCK_PEER_SECONDS" in (ROOT / _names.DOCS_FAULTS).read_text()
