"""The intervals of a difference between two settings (vlbert/study/report/intervals.py): their
coverage on a simulated study whose deltas are known, with seed and item noise both present."""

import math

import numpy as np
import pytest
from scipy.special import expit, logit

from vlbert.study.report.intervals import HELPS, HURTS, NOT_SHOWN, compare_scores, verdict


class World:
    """Two settings scored on items drawn from one population. A run of a setting on an item is
    right with probability expit(logit(difficulty) + effect + its seed's offset); a seed's offsets
    in the two settings are correlated (`shared`: the share of their variance that common random
    numbers give both), and a run's answer on an item is its own draw (seed-item interaction)."""

    def __init__(self, effect: float, seed_sd: float, shared: float, rng):
        self.effect, self.seed_sd, self.shared, self.rng = effect, seed_sd, shared, rng

    def offsets(self, n: int) -> np.ndarray:
        common = self.rng.normal(0, self.seed_sd * math.sqrt(self.shared), n)
        own = self.rng.normal(0, self.seed_sd * math.sqrt(1 - self.shared), (2, n))
        return common + own  # [setting, seed]

    def difficulties(self, m: int) -> np.ndarray:
        return self.rng.beta(3, 2, m)

    def runs(self, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
        base, offsets = logit(self.difficulties(m)), self.offsets(n)
        first = expit(base[None, :] + self.effect + offsets[0][:, None])
        second = expit(base[None, :] + offsets[1][:, None])
        return (100.0 * (self.rng.random(first.shape) < first), 100.0 * (self.rng.random(second.shape) < second))

    def truth(self) -> float:
        """The expected difference over seeds and the item population (Monte Carlo, large)."""
        base, offsets = logit(self.difficulties(400_000)), self.offsets(400_000)
        return 100.0 * float(np.mean(expit(base + self.effect + offsets[0]) - expit(base + offsets[1])))


@pytest.mark.parametrize(
    "seeds, items, seed_sd, shared",
    [(3, 600, 0.15, 0.5), (3, 600, 0.02, 0.5), (5, 300, 0.3, 0.0)],
    ids=["seeds dominate", "items dominate", "five unpaired seeds"],
)
def test_a_95_percent_interval_covers_a_known_delta_at_least_90_percent_of_the_time(seeds, items, seed_sd, shared):
    rng = np.random.default_rng(7)
    world = World(effect=0.2, seed_sd=seed_sd, shared=shared, rng=rng)
    truth = world.truth()
    studies, covered, widths = 300, 0, []
    for study in range(studies):
        first, second = world.runs(seeds, items)
        result = compare_scores(first, second, paired_seeds=shared > 0, replicates=400, seed=study)
        covered += result.low <= truth <= result.high
        widths.append(result.half_width)
    coverage = covered / studies
    assert coverage >= 0.90, f"coverage {coverage:.3f} of the nominal 95% (truth {truth:.2f})"
    assert coverage <= 0.995, f"coverage {coverage:.3f}: the intervals are far wider than they need be"


def test_pairing_the_seeds_cancels_what_their_runs_share():
    rng = np.random.default_rng(3)
    world = World(effect=0.2, seed_sd=0.8, shared=0.9, rng=rng)
    first, second = world.runs(3, 2000)
    paired = compare_scores(first, second, paired_seeds=True, seed=1)
    unpaired = compare_scores(first, second, paired_seeds=False, seed=1)
    assert paired.delta == pytest.approx(unpaired.delta)
    assert paired.seed_se < unpaired.seed_se / 2


def test_a_delta_s_verdict_p_and_parts():
    # Every seed of the first setting right on 3 items of 4 more than the second's: +25 points,
    # no seed spread, so only the items' resampling widens it.
    first = np.tile([100.0, 100.0, 100.0, 100.0] * 50, (3, 1))
    second = np.tile([100.0, 0.0, 0.0, 0.0] * 50, (3, 1))
    result = compare_scores(first, second, paired_seeds=True, replicates=500)
    assert result.delta == pytest.approx(75.0) and result.seed_se == 0
    assert result.verdict == HELPS and result.p_first_beats == 1.0
    assert result.low > 60 and result.high < 90 and math.isinf(result.df)
    assert compare_scores(second, first, paired_seeds=True).verdict == HURTS
    assert compare_scores(first, first, paired_seeds=True).p_first_beats == 0.5  # every run ties
    # The bootstrap's own seed makes it repeatable.
    again = compare_scores(first, second, paired_seeds=True, replicates=500)
    assert again == result


def test_one_seed_on_a_side_shows_nothing_and_items_must_match():
    one = compare_scores(np.full((1, 10), 100.0), np.zeros((3, 10)), paired_seeds=False)
    assert math.isnan(one.low) and one.verdict == NOT_SHOWN
    assert verdict(-1.0, 2.0) == NOT_SHOWN and verdict(0.5, 2.0) == HELPS and verdict(-3.0, -0.1) == HURTS
    with pytest.raises(ValueError, match="same items"):
        compare_scores(np.zeros((3, 10)), np.zeros((3, 9)), paired_seeds=True)
    with pytest.raises(ValueError, match="as many runs"):
        compare_scores(np.zeros((3, 10)), np.zeros((2, 10)), paired_seeds=True)
