"""The operator's command line: peering priorities."""

from __future__ import annotations

from strategyjob_operator.__main__ import peering_priority


def test_peered_replicas_draw_distinct_random_priorities_unless_given() -> None:
    drawn = {peering_priority(None, standalone=False) for _ in range(20)}
    assert len(drawn) > 1 and all(p >= 1 for p in drawn)
    assert peering_priority(7, standalone=False) == 7
    assert peering_priority(None, standalone=True) == 0
