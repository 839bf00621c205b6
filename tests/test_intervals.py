"""The intervals of a difference between two settings (vlbert/study/intervals.py): their
coverage on a simulated study whose deltas are known, with seed and item noise both present."""

import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit, logit

from vlbert.study.intervals import (
    HELPS,
    HURTS,
    NOT_SHOWN,
    compare_scores,
    repeat_chance,
    seeds_to_show,
    verdict,
)


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


def test_without_seed_noise_a_second_run_on_the_same_items_repeats_the_verdict():
    # The second run answers the same items: with no seed part nothing parts the two estimates,
    # so the verdict of delta +- 1.96 item SEs comes again, always.
    s = 1.5
    assert repeat_chance(3.0, 0.0, s, 3, HELPS) == 1.0  # 3.0 > 1.96 * 1.5: helps, again
    assert repeat_chance(2.5, 0.0, s, 3, NOT_SHOWN) == 1.0
    assert repeat_chance(2.5, 0.0, s, 3, HELPS) == 0.0
    assert repeat_chance(40.0, 1.0, 0.5, 10, HELPS) > 0.99
    assert math.isnan(repeat_chance(5.0, math.nan, 1.0, 3, HELPS))  # one seed on a side: no seed part
    assert math.isnan(repeat_chance(5.0, 1.0, 1.0, 1, HELPS))


@pytest.mark.slow  # 6,000 simulated studies: 16 s
@pytest.mark.parametrize("world_seed", [7, 8])
def test_the_predicted_repeat_chance_is_calibrated_on_simulated_pairs_of_runs(world_seed):
    # Studies whose delta is drawn wide (the flat prior the prediction assumes), each run three seeds
    # of per-seed differences (seed SD 4) on one test set whose sampling error (SE 2) both runs
    # share: over many studies, the mean predicted chance that the second run repeats the first's
    # verdict equals how often it did.
    rng = np.random.default_rng(world_seed)
    n, seed_sd, item_se = 3, 4.0, 2.0

    def run(on_these_items):
        per_seed = on_these_items + rng.normal(0, seed_sd, n)
        seed_se = per_seed.std(ddof=1) / math.sqrt(n)
        total = seed_se**2 + item_se**2
        df = total**2 / (seed_se**4 / (n - 1))
        half = stats.t.ppf(0.975, df) * math.sqrt(total)
        return per_seed.mean(), seed_se, verdict(per_seed.mean() - half, per_seed.mean() + half)

    predicted, repeated = [], []
    for truth in rng.uniform(-20, 20, 3000):
        on_these_items = truth + rng.normal(0, item_se)
        estimate, seed_se, first = run(on_these_items)
        predicted.append(repeat_chance(estimate, seed_se, item_se, n, first, draws=4000))
        repeated.append(run(on_these_items)[2] == first)
    assert np.mean(predicted) == pytest.approx(np.mean(repeated), abs=0.025)


def test_the_seeds_a_second_run_needs_to_show_a_delta():
    # A clear delta needs no more seeds than the run had; one the run leaves near 0 needs none up to
    # 100 (the sign itself is in doubt); in between, more seeds than three.
    assert seeds_to_show(10.0, 1.0, 0.5, 3) <= 3
    assert seeds_to_show(-10.0, 1.0, 0.5, 3) <= 3  # hurts, as clear
    assert seeds_to_show(0.5, 4.0, 0.5, 3) is None
    middle = seeds_to_show(7.3, 4.1, 0.8, 3)
    assert middle is not None and 3 < middle < 100
    assert repeat_chance(7.3, 4.1, 0.8, 3, HELPS, second_seeds=middle) >= 0.8
    assert repeat_chance(7.3, 4.1, 0.8, 3, HELPS, second_seeds=middle - 1) < 0.8
