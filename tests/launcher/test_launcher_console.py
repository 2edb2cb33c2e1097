"""Console: prefixed replica lines and the live status line kept below them."""

from __future__ import annotations

import io

from strategyjob.launcher import Console
from strategyjob.launcher._output import format_elapsed, format_report


def test_plain_output_has_prefixes_and_no_status():
    out = io.StringIO()
    console = Console(out, live_status=False)
    console.status("running 2")
    console.replica_line("worker-1", "loss 0.5")
    console.line("strategyjob: done")
    console.clear_status()
    assert out.getvalue() == "[worker-1] loss 0.5\nstrategyjob: done\n"


def test_live_status_is_redrawn_below_each_line():
    out = io.StringIO()
    console = Console(out, live_status=True)
    console.status("running 2")
    console.replica_line("chief-0", "hello")
    console.clear_status()
    console.line("summary")
    assert out.getvalue() == (
        "\r\x1b[Krunning 2" + "\r\x1b[K[chief-0] hello\nrunning 2" + "\r\x1b[K" + "summary\n"
    )


class ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError


def test_a_closed_reader_does_not_break_supervision():
    console = Console(ClosedPipe(), live_status=True)
    console.replica_line("worker-0", "x")  # must not raise
    console.status("running 1")
    console.line("done")


def test_format_elapsed():
    assert format_elapsed(3.14) == "3.1s"
    assert format_elapsed(75) == "1m15s"
    assert format_elapsed(3725) == "1h02m05s"


def test_format_report_without_a_step_shows_no_percentage():
    # mypy found it: totalSteps with no step computed 100.0 * None (TypeError)
    assert format_report({"step": 50, "totalSteps": 200}) == "step 50/200 (25%)"
    assert format_report({"totalSteps": 200, "metrics": {"loss": 0.5}}) == "step None/200 loss=0.5"
    assert format_report(None) == ""
