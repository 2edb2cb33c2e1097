"""``strategyjob run --curves``: the metrics' curves above the live status line on a real
pseudo-terminal, and once, as plain lines, at the end of the output (piped: only there)."""

from __future__ import annotations

import sys

import pytest
from strategyjob import cli

from tests.launcher.test_launcher_run import cli_env, run_cli, write_job
from tests.support.terminal import run_in_terminal, screen

pytestmark = pytest.mark.timeout(90)

REPORTING = """
import time, strategyjob
for step in range(1, 31):
    if step % 10 == 0:
        print(f"step {step} done", flush=True)
    strategyjob.report(step, total_steps=30, loss=1 / step)
    time.sleep(0.1)  # 3 s: several status refreshes (every 0.5 s) see new reports
"""
SUMMARY = "strategyjob: job demo succeeded in"


def terminal_env() -> dict[str, str]:
    env = cli_env()
    for name in ("COLUMNS", "LINES"):  # the terminal's own size, not the test runner's
        env.pop(name, None)
    return env


def test_on_a_terminal_the_curves_are_redrawn_below_the_replica_lines(tmp_path):
    manifest = write_job(tmp_path, {"worker": (1, REPORTING)})
    code, output = run_in_terminal(
        [sys.executable, "-m", "strategyjob", "run", str(manifest), "--curves"],
        terminal_env(),
        columns=100,
        lines=30,
    )
    assert code == 0, output
    summary = output.index(SUMMARY)
    live = output[:summary]
    assert live.count("loss  last ") >= 2, output  # drawn again as reports came
    # The screen just before the live block was erased for the summary: the replica lines,
    # then the block: a blank line, the curve, the status line (two rows: 100 columns).
    last_erase = live.rindex("\r\x1b[")
    rows = screen(live[:last_erase], columns=100)
    header = max(i for i, row in enumerate(rows) if row.startswith("loss  last "))
    assert rows[header - 1] == ""
    assert rows[header - 2] == "[worker-0] step 30 done", rows
    assert rows.count("[worker-0] step 10 done") == 1  # the block never overwrote a line
    assert rows[header + 1].endswith("│" + "█"), rows  # 1/step: the first column is the top
    status = rows[header + 8 :]  # the status line: two rows at 100 columns
    assert len(status) == 2 and len(status[0]) == 100, rows
    assert status[0].startswith("strategyjob: demo [MultiWorkerMirroredStrategy] running")
    assert "loss=" in status[1]
    # The final screen: every replica line, the summary, then the curves as plain lines; the
    # live block is gone.
    final = screen(output, columns=100)
    assert [r for r in final if r.startswith("[worker-0]")] == [
        f"[worker-0] step {s} done" for s in (10, 20, 30)
    ]
    assert final.index("[worker-0] step 30 done") < final.index(
        next(r for r in final if r.startswith(SUMMARY))
    )
    assert final.index("loss  last 0.03333 at step 30") > final.index(
        "strategyjob:   last progress report: step 30/30 (100%) loss=0.03333"
    )
    assert not any("running 1, succeeded" in r for r in final)
    assert final[-2].split() == ["1", "30"]  # the step axis, then the empty row of the cursor


def test_the_curves_are_drawn_again_for_a_new_report_not_at_every_refresh(tmp_path):
    source = "import time, strategyjob\nstrategyjob.report(1, loss=0.5)\ntime.sleep(2.5)\n"
    manifest = write_job(tmp_path, {"worker": (1, source)})
    code, output = run_in_terminal(
        [sys.executable, "-m", "strategyjob", "run", str(manifest), "--curves"], terminal_env()
    )
    assert code == 0, output
    live = output[: output.index(SUMMARY)]
    assert live.count("elapsed ") >= 4, output  # the status line, every 0.5 s
    assert live.count("loss  last 0.5 at step 1") == 1, output


def test_piped_the_curves_are_plain_lines_at_the_end(tmp_path):
    manifest = write_job(tmp_path, {"worker": (1, REPORTING.replace("0.1)", "0.01)"))})
    result = run_cli(manifest, "--curves", env=terminal_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\x1b" not in result.stdout and "\r" not in result.stdout
    lines = result.stdout.splitlines()
    header = lines.index("loss  last 0.03333 at step 30")
    assert lines[header - 1] == (
        "strategyjob:   last progress report: step 30/30 (100%) loss=0.03333"
    )
    assert lines[header + 1] == "      1 │█"  # 30 steps, a column each: 1/step
    assert lines[header + 6].startswith("0.03333 │█████▇")
    assert lines[header + 7 :] == [" " * 9 + "1" + "30".rjust(29)]  # the end of the output
    assert lines.count("loss  last 0.03333 at step 30") == 1  # drawn once


def test_no_metric_reported_is_one_line_not_an_empty_frame(tmp_path):
    manifest = write_job(tmp_path, {"worker": (1, "print('no report')\n")})
    result = run_cli(manifest, "--curves", env=terminal_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == (
        "strategyjob: --curves: no metric was reported (strategyjob.report), no curve to draw"
    )
    assert "│" not in result.stdout


def test_curves_with_no_status_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "job.yaml", "--no-status", "--curves"])
    assert info.value.code == 2
    assert "argument --curves: not allowed with argument --no-status" in capsys.readouterr().err
