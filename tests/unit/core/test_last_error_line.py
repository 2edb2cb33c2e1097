"""last_error_line(): the error a replica ended with, quoted by `strategyjob run`'s summary and
the operator's conditions."""

from __future__ import annotations

from strategyjob.errors import ERROR_LINE_MAX, exit_error_line, last_error_line

TRACEBACK = """\
step 3 loss=0.2
Traceback (most recent call last):
  File "train.py", line 9, in <module>
    raise ValueError("bad batch")
ValueError: bad batch
"""


def test_the_exception_line_of_the_last_traceback():
    assert last_error_line(TRACEBACK.splitlines()) == "ValueError: bad batch"


def test_a_chained_traceback_gives_the_last_exception():
    chained = TRACEBACK + (
        "\nDuring handling of the above exception, another exception occurred:\n\n"
        + TRACEBACK.replace("ValueError: bad batch", "RuntimeError: cleanup failed")
    )
    assert last_error_line(chained.splitlines()) == "RuntimeError: cleanup failed"


def test_a_multi_line_message_gives_its_first_line_and_later_output_does_not_hide_it():
    lines = [*TRACEBACK.splitlines(), "shape (3, 4)", "bye"]
    assert last_error_line(lines) == "ValueError: bad batch"


def test_without_a_traceback_the_last_line_that_says_error():
    lines = ["epoch 1", "fatal: could not read data.csv", "cleaning up"]
    assert last_error_line(lines) == "fatal: could not read data.csv"
    assert last_error_line(["sh: 1: trian.py: not found"]) == "sh: 1: trian.py: not found"


def test_only_a_process_that_ended_by_its_own_error_has_one():
    """Killed by a signal (OOM, SIGKILL; 128 and above from a shell), its last lines do not
    say why it ended: an old warning would be quoted as the cause."""
    lines = TRACEBACK.splitlines()
    assert exit_error_line(1, lines) == "ValueError: bad batch"
    assert [exit_error_line(code, lines) for code in (None, 0, 128, 137, -9)] == [None] * 5


def test_no_error_line_is_none_and_a_long_one_is_cut():
    assert last_error_line(["step 1", "step 2"]) is None
    assert last_error_line([]) is None
    long = last_error_line([f"ValueError: {'x' * 500}"])
    assert long is not None and len(long) == ERROR_LINE_MAX and long.endswith("...")
