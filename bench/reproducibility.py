"""Benchmark: two runs of the study against the two-runs bar, and what one run predicts for a second.

Reads two report folders (`reports/<preset>/` of two fresh runs: two machines, or one thread against
two, or a committed reference report). Cell by cell (Table 4, and the systems table where both have
it): the two means, their difference, the standard error of that difference (from each cell's
reported-split SE) and whether it is within two of them; beside it the SE of the difference the
seeds' spread gives, and what that spread alone predicts (the chance two runs land within two SEs).
Then every delta the reports state with a 95% interval (the findings' task deltas, the
data-fraction gaps): whether the two intervals overlap and whether the verdicts (helps, hurts, not
shown) match. The bar: at least 95% of the intervals overlap, and no delta helps in one run and
hurts in the other.

Beside the verdicts that agree it prints how many the first run alone predicted. Given one folder,
it predicts per stated delta the chance that a second run with as many seeds gives its verdict
again, and the fewest seeds a setting at which a second run would show the delta with its sign 80%
of the time (vlbert/study/intervals.py, `repeat_chance`, `seeds_to_show`).

    python bench/reproducibility.py reports/reference/mini reports/mini
    python bench/reproducibility.py reports/reference/mini
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from statistics import NormalDist

import pandas as pd

CELL = ["setting", "task"]
NO_DATA = "no data"  # the report's verdict for a finding whose settings a run lacks


def table4_cells(report: Path) -> pd.DataFrame:
    """One row per (setting, task): mean and the SE of the reported split (table4_controls.csv), the
    seeds' standard deviation and count (table4.csv)."""
    controls = pd.read_csv(report / "table4_controls.csv")
    table = pd.read_csv(report / "table4.csv")
    tasks = sorted(c.removesuffix("_std") for c in table.columns if c.endswith("_std"))
    seeds = pd.DataFrame(
        [
            {"setting": r["setting"], "task": t, "std": r[f"{t}_std"], "n": r[f"{t}_n"]}
            for _, r in table.iterrows()
            for t in tasks
        ]
    )
    cells = controls[["setting", "task", "mean", "se"]].dropna(subset=["mean"]).merge(seeds, on=CELL, how="left")
    return cells.assign(system="vlbert")


def systems_cells(report: Path) -> pd.DataFrame:
    """The systems table's cells (systems.csv), every system's rows; empty without the file."""
    path = report / "systems.csv"
    if not path.is_file():
        return pd.DataFrame(columns=["system", "setting", "task", "mean", "se", "std", "n"])
    table = pd.read_csv(path)
    tasks = sorted(c.removesuffix("_se") for c in table.columns if c.endswith("_se"))
    rows = [
        {
            "system": r["system"],
            "setting": r["setting"],
            "task": t,
            "mean": r[f"{t}_mean"],
            "se": r[f"{t}_se"],
            "std": r[f"{t}_std"],
            "n": r[f"{t}_n"],
        }
        for _, r in table.iterrows()
        for t in tasks
    ]
    return pd.DataFrame(rows).dropna(subset=["mean"])


def compare_cells(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    both = a.merge(b, on=["system", *CELL], suffixes=("_a", "_b"))
    both["delta"] = both["mean_b"] - both["mean_a"]
    both["se_diff"] = (both["se_a"] ** 2 + both["se_b"] ** 2) ** 0.5
    both["within"] = both["delta"].abs() <= 2 * both["se_diff"]
    # A one-seed cell has no spread: the reported split's SE alone then.
    seed_var = [(both[f"std_{x}"].fillna(0) ** 2 / both[f"n_{x}"]) for x in "ab"]
    both["seed_se_diff"] = (seed_var[0] + seed_var[1]) ** 0.5
    both["within_noise"] = both["delta"].abs() <= 2 * both[["se_diff", "seed_se_diff"]].max(axis=1)
    return both


def within_chance(se_diff: float, seed_var: float) -> float:
    """The chance that two runs whose difference is normal with variance `seed_var` (the seeds' noise)
    land within two `se_diff` of each other (1 for cells without spread)."""
    if seed_var <= 0:
        return 1.0
    return 2 * NormalDist().cdf(2 * se_diff / math.sqrt(seed_var)) - 1


def seeds_for_even_odds(cells: pd.DataFrame, most: int = 1000) -> int | None:
    """The seeds per cell (in both runs) for an even chance that every cell is within two SEs, given each
    seed's spread as measured; None if more than `most`."""
    spread = (cells["std_a"].fillna(0) ** 2 + cells["std_b"].fillna(0) ** 2).tolist()
    for seeds in range(1, most + 1):
        if math.prod(within_chance(se, var / seeds) for se, var in zip(cells["se_diff"], spread)) >= 0.5:
            return seeds
    return None


def expected_from_seeds(cells: pd.DataFrame) -> str:
    chances = [within_chance(se, sd**2) for se, sd in zip(cells["se_diff"], cells["seed_se_diff"])]
    needed = seeds_for_even_odds(cells)
    return (
        f"from the seeds' spread alone: {sum(chances):.1f} of {len(cells)} cells expected within two SEs, "
        f"every cell with chance {math.prod(chances):.3f}; even odds of every cell need "
        f"{needed if needed else 'over 1000'} seeds a cell"
    )


def findings(report: Path, name: str) -> dict:
    path = report / name
    return {f["id"]: f for f in json.loads(path.read_text())} if path.is_file() else {}


def judgement(entry: dict) -> str | None:
    """A delta's verdict: the report's (helps, hurts, not shown, from its 95% interval), or, in a
    report written before intervals, its beyond-the-noise judgement read the same way."""
    if "verdict" in entry and entry.get("low", "absent") != "absent":
        return entry["verdict"]
    beyond = entry.get("beyond_noise")
    if beyond is None or entry.get("delta") is None:
        return None
    return ("helps" if entry["delta"] > 0 else "hurts") if beyond else "not shown"


def overlap(a: dict, b: dict) -> bool | None:
    """Whether two runs' 95% intervals of one delta overlap (None where either has none)."""
    bounds = [a.get("low"), a.get("high"), b.get("low"), b.get("high")]
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in bounds):
        return None
    return bool(a["low"] <= b["high"] and b["low"] <= a["high"])


def compare_findings(a: dict, b: dict) -> list[dict]:
    rows = []
    for key in sorted(a.keys() & b.keys()):
        if NO_DATA in (a[key]["verdict"], b[key]["verdict"]):
            continue  # a run without one of its settings (a partial run) has no verdict to compare
        tasks_a = {t["task"]: t for t in a[key]["tasks"]}
        tasks_b = {t["task"]: t for t in b[key]["tasks"]}
        for task in sorted(tasks_a.keys() & tasks_b.keys()):
            rows.append(
                {
                    "finding": key,
                    "task": task,
                    "delta_a": tasks_a[task]["delta"],
                    "delta_b": tasks_b[task]["delta"],
                    "judged_a": judgement(tasks_a[task]),
                    "judged_b": judgement(tasks_b[task]),
                    "overlap": overlap(tasks_a[task], tasks_b[task]),
                    "verdict_a": a[key]["verdict"],
                    "verdict_b": b[key]["verdict"],
                }
            )
    return rows


def stated_deltas(report: Path) -> pd.DataFrame:
    """Every delta the report states with an interval: the findings' task deltas (findings.json,
    systems_findings.json) and the data-fraction gaps, one row each with what its interval was made
    from (its seed and item parts; nan in a report written before they were kept)."""
    rows = []
    for name in ("findings.json", "systems_findings.json"):
        for key, finding in findings(report, name).items():
            for task in finding["tasks"]:
                seeds = min(task.get("seeds") or [0])
                rows.append({"delta_of": key, "task": task["task"], **_interval_parts(task, seeds)})
    path = report / "data_fractions.csv"
    if path.is_file():
        for gap in pd.read_csv(path).to_dict("records"):
            if gap["fraction"] == 1.0 and ("pretrain_helps", gap["task"]) in {
                (r["delta_of"], r["task"]) for r in rows
            }:
                continue  # the whole set's gap is the findings' `full` - `no_pretrain`: counted once
            seeds = int(min(gap["full_n"], gap["no_pretrain_n"]))
            parts = _interval_parts({**gap, "delta": gap["gap"]}, seeds)
            rows.append({"delta_of": f"fraction {gap['fraction']:g}", "task": gap["task"], **parts})
    return pd.DataFrame(rows)


def _interval_parts(entry: dict, seeds: int) -> dict:
    parts = {k: entry.get(k, math.nan) for k in ("delta", "low", "high", "seed_se", "item_se")}
    parts = {k: math.nan if v is None else float(v) for k, v in parts.items()}
    return {**parts, "seeds": seeds, "verdict": judgement(entry)}


def predict_repeats(deltas: pd.DataFrame, chance: float | None = 0.8) -> pd.DataFrame:
    """Per delta, from this run alone: the chance that a second run with as many seeds gives its
    verdict again, and (unless `chance` is None) the fewest seeds a setting at which a second run
    shows it with its sign with `chance` (intervals.repeat_chance and seeds_to_show: the delta on
    these test items as uncertain as the run's seeds leave it, the second run's seed part
    shrinking with its seeds)."""
    from vlbert.study.intervals import repeat_chance, seeds_to_show

    out = deltas.copy()
    args = [(r["delta"], r["seed_se"], r["item_se"], r["seeds"]) for r in deltas.to_dict("records")]
    out["repeats"] = [repeat_chance(*a, target=v) for a, v in zip(args, deltas["verdict"])]
    if chance is not None:
        out[f"seeds_for_{chance:.0%}"] = [
            None if any(math.isnan(x) for x in a[:3]) else seeds_to_show(*a, chance=chance) for a in args
        ]
    return out


def print_predictions(report: Path) -> None:
    deltas = stated_deltas(report)
    if deltas.empty or deltas["seed_se"].isna().all():
        print(f"\n{report}: no delta with its interval's parts (a report written before they were kept)")
        return
    predicted = predict_repeats(deltas)
    column = predicted.columns[-1]
    print(
        f"\nWhat {report} predicts for a second run (repeats: the chance its verdict comes again with as many"
        f" seeds; {column}: the fewest seeds a setting for a second run to show the delta with its sign that often,"
        " '-' if no count up to 100 does):"
    )
    shown = predicted[["delta_of", "task", "delta", "low", "high", "verdict", "repeats", column]]
    shown[column] = shown[column].map(lambda n: "-" if n is None or pd.isna(n) else str(int(n)))
    print(shown.round(2).to_string(index=False))
    predicted = predicted.dropna(subset=["repeats"])
    shown_ones = predicted[predicted["verdict"] != "not shown"]
    print(
        f"expected to repeat: {predicted['repeats'].sum():.1f} of {predicted['repeats'].notna().sum()} verdicts;"
        f" of its shown ones (helps or hurts) {shown_ones['repeats'].sum():.1f} of {len(shown_ones)}"
    )


def compare_stated(a: Path, b: Path) -> None:
    """The two-runs bar over every stated delta both runs have: their intervals overlap (at least 95%
    of them) and none helps in one run and hurts in the other."""
    both = stated_deltas(a).merge(stated_deltas(b), on=["delta_of", "task"], suffixes=("_a", "_b"))
    both = both.rename(columns={"verdict_a": "judged_a", "verdict_b": "judged_b"})
    both["overlap"] = [
        overlap(dict(low=r["low_a"], high=r["high_a"]), dict(low=r["low_b"], high=r["high_b"]))
        for r in both.to_dict("records")
    ]
    known = both["overlap"].dropna()
    if known.empty:
        return
    same = int((both["judged_a"] == both["judged_b"]).sum())
    as_first = both.rename(columns={c: c.removesuffix("_a") for c in both.columns if c.endswith("_a")})
    first = predict_repeats(as_first.rename(columns={"judged": "verdict"}), chance=None)["repeats"]
    predicted = f" (the first alone predicted {first.sum():.1f})" if first.notna().any() else ""
    print(
        f"\nevery stated delta (the findings' and the data-fraction gaps): intervals overlapping {int(known.sum())}"
        f" of {len(known)} ({known.mean():.0%}; the bar: at least 95%);"
        f" the same verdict {same} of {len(both)}{predicted}; helps in one run and hurts in the other: {flipped(both)}"
    )


def flipped(rows: pd.DataFrame) -> int:
    """Deltas that one run says help and the other hurt."""
    return int(
        (
            ((rows["judged_a"] == "helps") & (rows["judged_b"] == "hurts"))
            | ((rows["judged_a"] == "hurts") & (rows["judged_b"] == "helps"))
        ).sum()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="one run's report folder (reports/<preset>)")
    parser.add_argument("b", type=Path, nargs="?", help="the other run's (without it: what the one run predicts)")
    args = parser.parse_args()
    pd.set_option("display.width", 200)
    if args.b is None:
        print_predictions(args.a)
        return

    cells = compare_cells(
        pd.concat([table4_cells(args.a), systems_cells(args.a).query("system != 'vlbert'")]),
        pd.concat([table4_cells(args.b), systems_cells(args.b).query("system != 'vlbert'")]),
    )
    shown = cells[["system", *CELL, "mean_a", "mean_b", "delta", "se_diff", "within", "seed_se_diff", "within_noise"]]
    shown = shown.round(2)
    print(shown.to_string(index=False))
    for system, part in cells.groupby("system", sort=False):
        worst = (part["delta"].abs() / part["se_diff"]).max()
        print(
            f"{system}: {int(part['within'].sum())} of {len(part)} cells within two SEs of the difference "
            f"(largest |difference| {worst:.2f} SEs)"
        )
        print(
            f"{system}: {int(part['within_noise'].sum())} of {len(part)} cells within two of the larger of that SE "
            f"and the seeds' (seed_se_diff)"
        )
        print(f"{system}: {expected_from_seeds(part)}")

    for name in ("findings.json", "systems_findings.json"):
        rows = compare_findings(findings(args.a, name), findings(args.b, name))
        if not rows:
            continue
        table = pd.DataFrame(rows)
        print(f"\n{name}:")
        print(table.round(2).to_string(index=False))
        verdicts = table.drop_duplicates("finding")
        same = (verdicts["verdict_a"] == verdicts["verdict_b"]).sum()
        judged = (table["judged_a"] == table["judged_b"]).sum()
        overlapping = table["overlap"].dropna()
        print(
            f"same verdict: {same} of {len(verdicts)} findings; the same task verdict (helps, hurts, not shown): "
            f"{judged} of {len(table)}; helps in one run and hurts in the other: {flipped(table)}"
            + (f"; intervals overlapping: {int(overlapping.sum())} of {len(overlapping)}" if len(overlapping) else "")
        )

    fractions = [args.a / "data_fractions.csv", args.b / "data_fractions.csv"]
    if all(path.is_file() for path in fractions):
        a, b = (pd.read_csv(path) for path in fractions)
        for frame in (a, b):
            frame["judged"] = [judgement({"delta": r["gap"], **r}) for r in frame.to_dict("records")]
        both = a.merge(b, on=["task", "fraction"], suffixes=("_a", "_b"))
        both["gap_diff_se"] = sum(both[f"{s}_se_{x}"] ** 2 for s in ("full", "no_pretrain") for x in "ab") ** 0.5
        both["within"] = (both["gap_b"] - both["gap_a"]).abs() <= 2 * both["gap_diff_se"]
        print("\ndata_fractions.csv (gap: full minus no_pretrain; gap_diff_se: the SE of the two gaps' difference):")
        print(
            both[["task", "fraction", "gap_a", "gap_b", "gap_diff_se", "within", "judged_a", "judged_b"]]
            .round(2)
            .to_string(index=False)
        )
        same = (both["judged_a"] == both["judged_b"]).sum()
        print(
            f"the same verdict: {same} of {len(both)} gaps; helps in one run and hurts in the other: {flipped(both)}"
        )

    compare_stated(args.a, args.b)


if __name__ == "__main__":
    main()
