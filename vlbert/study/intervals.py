"""A difference between two settings with its 95% interval, P(A>B) and a verdict, from what the
runs hold: their seeds and the test items every run answers.

A setting's figure on a task is the mean over its seeds of each run's mean item score on the
reported split. Its difference from another setting's has two sources of noise: training (the run
a seed gives, with its own pre-training under `pretrain.per_seed`) and the test items (a finite
sample of the items the task could ask). Both are resampled, as the field recommends, in a
hierarchical bootstrap: the seeds within each setting (Bouthillier et al., MLSys 2021,
"Accounting for variance in machine learning benchmarks": the training's randomness is a source of
variance of its own), then the test items, paired across the two settings (Koehn, EMNLP 2004,
"Statistical significance tests for machine translation evaluation"; Dror et al., ACL 2018, "The
hitchhiker's guide to testing statistical significance in NLP"). Where both settings ran the same
seeds (seed s of every setting draws the same randomness: common random numbers), the seeds are
resampled as pairs, so that what the two runs of a seed share cancels.

Few seeds: resampling n seeds with replacement gives their spread (n-1)/n of its variance and
takes the estimate for exact. So each replicate's seed part (its figure on every item, minus the
estimate) is scaled by sqrt(n/(n-1)), and the interval is the estimate ± t times the replicates'
standard deviation, t with Welch-Satterthwaite's degrees of freedom: n-1 for the seed part (three
seeds: 2, t = 4.3), unbounded for the items'. A cell's seeds then widen its interval as a t-test
of the per-seed differences would, and many items narrow it as the paired bootstrap does.
A run's answers on particular items (the seed-item interaction) would count in both levels; their
share, read from the two-way residual, is taken off the items' part. `tests/test_intervals.py`
checks the coverage on a simulated study whose deltas are known.

P(A>B) is Bouthillier et al.'s probability of outperforming: the chance that a run of A scores
above a run of B (the same seed's, where they are paired; ties count half), averaged over the
replicates. The verdict reads the interval: "helps" above 0, "hurts" below, else "not shown".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

REPLICATES = 2000
LEVEL = 0.95
HELPS, HURTS, NOT_SHOWN = "helps", "hurts", "not shown"


@dataclass(frozen=True)
class Delta:
    """First minus second, in the scores' unit (accuracy points)."""

    delta: float
    low: float
    high: float
    p_first_beats: float  # P(A>B)
    seed_se: float  # the seed part's standard error (t-corrected)
    item_se: float  # the items' part
    df: float  # Welch-Satterthwaite's degrees of freedom of the interval
    seeds: tuple[int, int]  # runs of each side
    items: int
    paired_seeds: bool

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def verdict(self) -> str:
        return verdict(self.low, self.high)

    def as_dict(self) -> dict:
        return {**asdict(self), "half_width": self.half_width, "verdict": self.verdict}


def verdict(low: float, high: float) -> str:
    """helps: the interval is above 0; hurts: below; not shown: it holds 0 (or is unknown)."""
    if math.isnan(low) or math.isnan(high):
        return NOT_SHOWN
    return HELPS if low > 0 else HURTS if high < 0 else NOT_SHOWN


def _seed_weights(rng, replicates: int, n: int) -> np.ndarray:
    """[replicates, n]: how often each seed is drawn, n draws with replacement a replicate."""
    return rng.multinomial(n, np.full(n, 1 / n), size=replicates).astype(np.float64)


def compare_scores(
    first: np.ndarray,
    second: np.ndarray,
    paired_seeds: bool,
    replicates: int = REPLICATES,
    level: float = LEVEL,
    seed: int = 0,
) -> Delta:
    """`first` [seeds, items] and `second` [seeds, items]: each run's score per test item (the same
    items in the same order), in percent. `paired_seeds`: row s of both is seed s (common random
    numbers). Deterministic for a `seed` (the bootstrap's own)."""
    first, second = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    (n_a, m), (n_b, m_b) = first.shape, second.shape
    if m != m_b or m == 0:
        raise ValueError(f"the two settings must be scored on the same items ({m} and {m_b})")
    if paired_seeds and n_a != n_b:
        raise ValueError(f"paired seeds need as many runs on each side ({n_a} and {n_b})")
    rng = np.random.default_rng(seed)
    estimate = float(first.mean() - second.mean())
    # Items resampled (the same draw for both settings), as counts per item: [replicates, items].
    counts = rng.multinomial(m, np.full(m, 1 / m), size=replicates).astype(np.float64) / m
    runs_a, runs_b = counts @ first.T, counts @ second.T  # each run's figure per replicate
    full_a, full_b = first.mean(axis=1), second.mean(axis=1)  # on every item once
    weights_a = _seed_weights(rng, replicates, n_a)
    weights_b = weights_a if paired_seeds else _seed_weights(rng, replicates, n_b)
    seed_part = (weights_a @ full_a) / n_a - (weights_b @ full_b) / n_b - estimate
    resampled = (weights_a * runs_a).sum(axis=1) / n_a - (weights_b * runs_b).sum(axis=1) / n_b
    item_part = resampled - estimate - seed_part
    # One seed on a side leaves its seed part unknown: nan, so the interval is too.
    smallest = min(n_a, n_b)
    scale = math.sqrt(smallest / (smallest - 1)) if smallest > 1 else math.nan
    seed_var = float(np.var(scale * seed_part))
    # The bootstrap counts a run's answers on particular items (the seed-item interaction) in both
    # levels: once in each run's figure, once in each item's mean over the runs. Its share, from the
    # two-way residual of each side (of the paired differences where the seeds pair), comes off the items'.
    sides = [first - second] if paired_seeds else [first, second]
    item_var = max(float(np.var(item_part)) - sum(_interaction_variance(side) for side in sides), 0.0)
    total = seed_var + item_var
    seed_df = max(smallest - 1, 1)
    df = math.inf if seed_var == 0 else total**2 / (seed_var**2 / seed_df)
    t = float(stats.t.ppf(0.5 + level / 2, df)) if not math.isnan(total) else math.nan
    half = t * math.sqrt(total)
    return Delta(
        delta=estimate,
        low=estimate - half,
        high=estimate + half,
        p_first_beats=_probability_of_outperforming(runs_a, runs_b, weights_a, weights_b, paired_seeds),
        seed_se=math.sqrt(seed_var),
        item_se=math.sqrt(item_var),
        df=df,
        seeds=(n_a, n_b),
        items=m,
        paired_seeds=paired_seeds,
    )


def _interaction_variance(scores: np.ndarray) -> float:
    """The variance the seed-item interaction gives the mean of `scores` [seeds, items]: the two-way
    residual's mean square over seeds x items (0 with one seed or one item)."""
    n, m = scores.shape
    if n < 2 or m < 2:
        return 0.0
    residual = scores - scores.mean(axis=1, keepdims=True) - scores.mean(axis=0, keepdims=True) + scores.mean()
    return float((residual**2).sum() / ((n - 1) * (m - 1)) / (n * m))


def _probability_of_outperforming(runs_a, runs_b, weights_a, weights_b, paired: bool) -> float:
    """P(a run of A beats a run of B) on the replicates' items and seeds, ties half."""
    if paired:
        wins = (runs_a > runs_b) + 0.5 * (runs_a == runs_b)  # [replicates, seeds]
        return float(((weights_a * wins).sum(axis=1) / weights_a.sum(axis=1)).mean())
    wins = (runs_a[:, :, None] > runs_b[:, None, :]) + 0.5 * (runs_a[:, :, None] == runs_b[:, None, :])
    pair_weights = weights_a[:, :, None] * weights_b[:, None, :]
    return float(((pair_weights * wins).sum(axis=(1, 2)) / pair_weights.sum(axis=(1, 2))).mean())


def compare_summaries(  # noqa: PLR0913 - two settings' four figures each
    mean_a: float,
    std_a: float,
    n_a: int,
    se_a: float,
    mean_b: float,
    std_b: float,
    n_b: int,
    se_b: float,
    level: float = LEVEL,
) -> Delta:
    """The same interval where only each setting's summary is known (no per-item scores): mean, seed
    standard deviation, seeds, and the standard error of one run's figure on its items. The seeds
    count as unpaired and the items as independent (an upper bound for items the two share); no P(A>B)."""
    seed_parts = [std**2 / n if n > 1 else math.nan for std, n in ((std_a, n_a), (std_b, n_b))]
    item_var = se_a**2 + se_b**2
    total = sum(seed_parts) + item_var
    denominator = sum(part**2 / (n - 1) for part, n in zip(seed_parts, (n_a, n_b)) if n > 1)
    df = math.inf if denominator == 0 else total**2 / denominator
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(total) if not math.isnan(total) else math.nan
    estimate = mean_a - mean_b
    return Delta(
        delta=estimate,
        low=estimate - half,
        high=estimate + half,
        p_first_beats=math.nan,
        seed_se=math.sqrt(sum(seed_parts)),
        item_se=math.sqrt(item_var),
        df=df,
        seeds=(int(n_a), int(n_b)),
        items=0,
        paired_seeds=False,
    )


def repeat_chance(  # noqa: PLR0913 - one delta's figures, the second run's seeds
    delta: float,
    seed_se: float,
    item_se: float,
    seeds: int,
    target: str,
    second_seeds: int | None = None,
    level: float = LEVEL,
    draws: int = 20_000,
    seed: int = 0,
) -> float:
    """The chance that a second run of the same study, with `second_seeds` seeds a setting (default:
    the first's `seeds`), gives this delta the verdict `target`, predicted from the first run alone.

    The second run answers the same test items, so what parts its delta from the first's is the
    seeds (each its own pre-training): the two share the items' sampling error. What the first run
    leaves uncertain is drawn from its posterior under the usual reference prior (flat on the delta,
    1/variance on the seeds' variance): the seeds' variance (its estimate is a chi-square with
    seeds - 1 degrees of freedom: three seeds often understate it), then the delta on these items
    around the estimate with that variance. The second run draws its estimate around that delta
    with its own seed part, which shrinks with its seeds, and makes its interval as
    `compare_scores` makes one: from a seed variance it estimates with `second_seeds` - 1 degrees
    of freedom, plus the items' part. Monte Carlo with `draws` draws, deterministic for a `seed`;
    nan where a side has one seed (no seed part)."""
    if any(math.isnan(x) for x in (delta, seed_se, item_se)) or seeds < 2:
        return math.nan
    n = second_seeds or seeds
    if n < 2:
        return math.nan
    rng = np.random.default_rng(seed)
    seed_var = seed_se**2 * (seeds - 1) / rng.chisquare(seeds - 1, draws)  # the first run's seeds' part
    on_these_items = delta + np.sqrt(seed_var) * rng.normal(size=draws)
    seed_var = seed_var * seeds / n  # the second run's
    estimate = on_these_items + np.sqrt(seed_var) * rng.normal(size=draws)
    seed_var_seen = seed_var * rng.chisquare(n - 1, draws) / (n - 1)
    total = seed_var_seen + item_se**2
    with np.errstate(divide="ignore", invalid="ignore"):
        second_df = np.where(seed_var_seen > 0, total**2 / (seed_var_seen**2 / (n - 1)), np.inf)
    half = stats.t.ppf(0.5 + level / 2, second_df) * np.sqrt(total)
    verdicts = np.where(estimate - half > 0, HELPS, np.where(estimate + half < 0, HURTS, NOT_SHOWN))
    return float(np.mean(verdicts == target))


def seeds_to_show(
    delta: float,
    seed_se: float,
    item_se: float,
    seeds: int,
    chance: float = 0.8,
    most: int = 100,
    draws: int = 20_000,
) -> int | None:
    """The fewest seeds a setting (2 to `most`) at which a second run shows this delta with its sign
    (helps if positive, hurts if negative) with at least `chance`, predicted as `repeat_chance`
    predicts; None if no count up to `most` does (the first run leaves the sign itself that
    uncertain). Where the chance grows slowly with the seeds, the count carries the Monte Carlo's
    error (a few hundredths of chance): read a large one as its order of magnitude."""
    target = HELPS if delta > 0 else HURTS

    def enough(n: int) -> bool:
        return repeat_chance(delta, seed_se, item_se, seeds, target, second_seeds=n, draws=draws) >= chance

    # More seeds narrow the second run's interval, so the chance grows with them: bisect.
    if not enough(most):
        return None
    low, high = 1, most  # enough(high), and 1 seed shows nothing
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high
