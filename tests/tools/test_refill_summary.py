"""The cold-cache report's arithmetic (``tools/dataservice_tools/loadtest/refill.py``), on
scrapes made up to the millisecond, so that each figure can be worked by hand."""

from __future__ import annotations

from collections import Counter

from dataservice_tools.loadtest.refill import REFILLED, refill_summary


def _scrapes(per_second: list[tuple[int, int, int]]) -> list[tuple[float, Counter[str]]]:
    """Cumulative counts scraped at 0.25 s past each second, from (hits, misses,
    database operations) made in each second, evenly."""
    points = [(0.0, Counter())]
    total: Counter[str] = Counter()
    for second, (hits, misses, database) in enumerate(per_second):
        total = total + Counter(hit=hits, miss=misses, database=database)
        points.append((second + 1.0, Counter(total)))
    # Scrapes never fall on the second: shift them and interpolate back.
    return [(t + 0.25 if t else t, counts) for t, counts in points]


def test_the_series_and_the_refill_time_are_worked_per_second() -> None:
    # Warm for 4 s, cold at 4.0, then a hit ratio of 0.5, 0.8, 0.95 and 0.98.
    seconds = [(98, 2, 2)] * 4 + [(0, 100, 40), (50, 50, 40), (80, 20, 20), (95, 5, 5), (98, 2, 2)]
    summary = refill_summary(_scrapes(seconds), cold_at_s=4.0, duration_s=9.0)
    ratio = summary["series"]["hit_ratio"]
    # Each second's share, a quarter of the next one's mixed in by the shifted scrapes.
    assert ratio[0] == 0.98
    assert 0.0 < ratio[4] < 0.5
    assert summary["hit_ratio_before"] == 0.98
    # The window from 4.25 s to 5.25 s holds second 4's reads alone: every one a miss.
    assert summary["hit_ratio_lowest_after"] == 0.0
    assert summary["database_peak_per_s"] == 40
    # At 0.9 from second 7 on (0.95 with a quarter of 0.98), for good: 4 s after the rotation.
    assert ratio[6] < REFILLED <= min(ratio[7:])
    assert summary["refilled_s"] == 4.0


def test_a_cache_not_back_by_the_end_has_no_refill_time() -> None:
    seconds = [(98, 2, 2)] * 3 + [(0, 100, 40)] * 3
    summary = refill_summary(_scrapes(seconds), cold_at_s=3.0, duration_s=6.0)
    assert summary["refilled_s"] is None
    assert summary["series"]["database_per_s"][:2] == [2, 2]


def test_a_run_with_no_rotation_reports_only_the_series() -> None:
    summary = refill_summary(_scrapes([(10, 0, 1)] * 3), cold_at_s=None, duration_s=3.0)
    assert summary["refilled_s"] is None
    assert "hit_ratio_before" not in summary
    assert summary["series"]["hit_ratio"] == [1.0, 1.0, 1.0]
