"""`soul bench fairness`: what it derives from its phases."""

from __future__ import annotations

from soul_apps.bench.fairness import busy_cores, fair_share_bound


def test_the_fair_share_bound_is_b_alones_busy_cores_over_its_share_and_never_below_one() -> None:
    assert fair_share_bound(1.5, 2) == 1.5  # B alone kept 1.5 of 2 cores busy; beside a flood it gets 1
    assert fair_share_bound(0.4, 2) == 1.0  # within its share: a fair node can keep its latency
    assert fair_share_bound(3.0, 4, share=0.25) == 3.0
    assert fair_share_bound(None, 2) is None
    assert busy_cores((100, 1000), (400, 1400), 2) == 1.5  # 300 of 400 ticks busy, on 2 cores
    assert busy_cores((100, 1000), (100, 1000), 2) is None
