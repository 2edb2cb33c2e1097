"""Console: prefixed replica lines and the live status line kept below them."""

from __future__ import annotations

import io

from strategyjob.launcher import Console
from strategyjob.launcher._output import format_elapsed, format_report

from tests.support.terminal import screen


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


def test_a_block_is_erased_and_redrawn_below_each_line_and_only_its_status_when_the_rest_holds():
    out = io.StringIO()
    console = Console(out, live_status=True, columns=lambda: 20)
    written = []

    def step(action) -> None:
        start = len(out.getvalue())
        action()
        written.append(out.getvalue()[start:])

    step(lambda: console.status("s1", above=["a", "b"]))
    step(lambda: console.status("s2", above=["a", "b"]))  # the same curves: the status alone
    step(lambda: console.replica_line("w", "x"))
    step(lambda: console.status("long status " * 2, above=["c"]))  # 24 columns: two rows
    step(lambda: console.replica_line("w", "y"))
    step(console.clear_status)
    step(lambda: console.line("summary"))
    assert written == [
        "\r\x1b[K" + "a\nb\ns1",
        "\r\x1b[K" + "s2",
        "\r\x1b[2A\x1b[J" + "[w] x\na\nb\ns2",
        "\r\x1b[2A\x1b[J" + "c\nlong status long status ",
        "\r\x1b[2A\x1b[J" + "[w] y\nc\nlong status long status ",
        "\r\x1b[2A\x1b[J",
        "summary\n",
    ]
    assert screen(out.getvalue(), columns=20) == ["[w] x", "[w] y", "summary", ""]


def test_the_screen_keeps_replica_lines_above_the_block():
    out = io.StringIO()
    console = Console(out, live_status=True, columns=lambda: 80)
    console.replica_line("worker-0", "start")
    console.status("step 1", above=["", "loss  last 1 at step 1"])
    console.replica_line("worker-0", "step 1 done")
    console.status("step 2", above=["", "loss  last 0.5 at step 2"])
    console.replica_line("worker-1", "step 2 done")
    assert screen(out.getvalue(), columns=80) == [
        "[worker-0] start",
        "[worker-0] step 1 done",
        "[worker-1] step 2 done",
        "",
        "loss  last 0.5 at step 2",
        "step 2",
    ]


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
