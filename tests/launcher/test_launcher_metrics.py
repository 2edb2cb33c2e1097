"""``strategyjob run --metrics FILE`` keeps every report of the leader (none lost to the
status line's rate limit) and ``strategyjob metrics --file FILE`` prints it."""

from __future__ import annotations

import subprocess
import sys

from strategyjob._history import MetricHistory

from tests.launcher.test_launcher_run import cli_env, run_cli, write_job


def metrics_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strategyjob", "metrics", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
    )


def test_every_report_of_the_leader_is_kept_and_printed(tmp_path):
    manifest = write_job(
        tmp_path,
        {
            "worker": (
                2,
                """
                import os, strategyjob
                leader = os.environ["STRATEGYJOB_REPLICA_INDEX"] == "0"
                for step in range(1, 301):  # far faster than the 0.5 s between writes
                    loss = 1 / step if leader else -1.0
                    strategyjob.report(step, total_steps=300, loss=loss, phase="train")
                strategyjob.report(301, accuracy=0.75)
                """,
            )
        },
    )
    out = tmp_path / "metrics.json"
    result = run_cli(manifest, "--metrics", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        f"strategyjob: metric history (301 points: accuracy, loss) in {out}; print it with "
        f"strategyjob metrics --file {out}"
    ) in result.stdout
    series = MetricHistory.from_json(out.read_text()).series()
    assert series["loss"] == [(step, 1 / step) for step in range(1, 301)]  # worker-1's: none
    assert series["accuracy"] == [(301, 0.75)]
    assert "phase" not in series  # not a number

    csv = metrics_cli("--file", str(out), "--csv")
    assert csv.returncode == 0, csv.stderr
    lines = csv.stdout.splitlines()
    assert lines[:3] == ["step,accuracy,loss", "1,,1.0", "2,,0.5"]
    assert lines[-1] == "301,0.75,"
    assert len(lines) == 302

    table = metrics_cli("--file", str(out))
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()
    assert rows[0].split() == ["STEP", "accuracy", "loss"]
    assert rows[3].split() == ["3", "0.333333"]
    assert rows[-1].split() == ["301", "0.75"]

    plot = metrics_cli("--file", str(out), "--plot")
    assert plot.returncode == 0, plot.stderr
    assert "accuracy  last 0.75 at step 301" in plot.stdout
    assert "loss  last 0.003333 at step 300" in plot.stdout
    assert "█" in plot.stdout


def test_a_file_that_is_not_a_history_is_refused_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 9, "series": {}}')
    result = metrics_cli("--file", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"strategyjob metrics: {bad}: metric history version 9 is not 1, the one this "
        "strategyjob reads; read it with the strategyjob that wrote it"
    )
    missing = metrics_cli("--file", str(tmp_path / "none.json"))
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr and "No such file" in missing.stderr
