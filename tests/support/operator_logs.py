"""Reading an operator's log for refused API calls."""

from __future__ import annotations

import re

# The logging prefix: "2026-11-29 06:13:02,403 " — its milliseconds may well read 403.
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d+\s*", re.MULTILINE)
# Whole words: a uid in a message may contain "403" inside a longer hex word.
_REFUSAL = re.compile(r"\b(403|Forbidden|forbidden|Not enough permissions)\b")


def refusals(log: str) -> list[str]:
    """The log's lines whose message (not its timestamp) tells of a refused request."""
    return [line for line in _TIMESTAMP.sub("", log).splitlines() if _REFUSAL.search(line)]
