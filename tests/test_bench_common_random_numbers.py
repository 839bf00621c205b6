"""bench/common_random_numbers.py's measures on simulated runs where what the seeds share is known."""

from pathlib import Path

import numpy as np
from conftest import load_bench

crn = load_bench(
    Path(__file__).resolve().parent.parent / "bench" / "common_random_numbers.py", "common_random_numbers"
)


def test_a_difference_that_shares_its_seeds_noise_has_none_left():
    rng = np.random.default_rng(0)
    a = rng.normal(60, 3, size=6)
    shared = crn.seed_level(a, a - 2 + rng.normal(0, 0.01, size=6))
    assert shared["paired"] < 0.01 and shared["ratio"] < 0.01
    independent = [crn.seed_level(rng.normal(60, 3, 6), rng.normal(58, 3, 6))["ratio"] for _ in range(400)]
    assert 0.8 < float(np.mean(independent)) < 1.2  # E[var(a - b)] = var(a) + var(b) when nothing is shared


def test_items_a_seed_gets_right_in_both_settings_show_as_paired_correlation():
    rng = np.random.default_rng(1)
    seeds, items = 3, 2000
    runs = rng.random((seeds, items)) < 0.6  # each seed's own items right
    flips = rng.random((seeds, items)) < 0.1
    a, b = 100.0 * runs, 100.0 * (runs ^ flips)  # the second setting repeats its seed's answers but 10%
    measured = crn.item_level(a, b)
    assert measured["correlation_paired"] > 0.7 and abs(measured["correlation_crossed"]) < 0.1
    assert measured["se_paired"] < measured["se_crossed"] and measured["variance_ratio"] < 0.3
    unrelated = crn.item_level(a, 100.0 * (rng.random((seeds, items)) < 0.6))
    assert 0.8 < unrelated["variance_ratio"] < 1.25


def test_the_report_has_a_row_per_pair_and_task_both_settings_ran():
    rng = np.random.default_rng(2)
    scores = {
        (setting, task, 1.0): ((0, 1, 2), 100.0 * (rng.random((3, 50)) < 0.5))
        for setting in ("full", "no_pretrain", "b")
        for task in ("vqa", "vcr_q2a")
    }
    scores[("c", "vqa", 1.0)] = ((0, 1), 100.0 * (rng.random((2, 50)) < 0.5))
    lines = crn.report(scores)
    rows = [tuple(line.split()[:4]) for line in lines[1:]]
    assert rows == [
        ("full", "-", "no_pretrain", "vcr_q2a"),
        ("full", "-", "no_pretrain", "vqa"),
        ("c", "-", "b", "vqa"),
    ]
