"""bench/refcoco_plateau.py's reading of a run and its other-expression pairs, on hand-made items."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import load_bench

BENCH = Path(__file__).resolve().parent.parent / "bench" / "refcoco_plateau.py"


def _bench():
    return load_bench(BENCH, "refcoco_plateau")


def test_a_run_leaves_the_plateau_at_its_first_epoch_over_the_mark_or_never():
    bench = _bench()
    history = [{"accuracy": a} for a in (21.0, 39.9, 40.0, 66.0)]
    assert bench.exit_epoch({"val_history": history}, 40.0) == 3
    assert bench.exit_epoch({"val_history": history[:2]}, 40.0) is None


def test_an_expression_is_swapped_only_for_another_referent_of_its_own_image():
    bench = _bench()

    def item(image, text, target_row):
        targets = torch.tensor([-1, 0, 0, 0])
        targets[target_row] = 1
        return {"regions": SimpleNamespace(image_path=image), "text": text, "targets": targets}

    examples = [item("a.jpg", "red circle", 1), item("a.jpg", "red one", 1), item("a.jpg", "blue star", 2)]
    examples.append(item("b.jpg", "green square", 1))  # the only expression of its image
    swapped, kept = bench.with_another_expression(examples)
    assert kept == [0, 1, 2]
    assert [e["text"] for e in swapped] == ["blue star", "blue star", "red circle"]
    assert all(s["regions"] is examples[k]["regions"] for s, k in zip(swapped, kept))


def test_a_head_is_a_rate_factor_and_optionally_centred_candidates():
    bench = _bench()
    assert bench.parse_head("1") == (1.0, False, None)
    assert bench.parse_head("10+centre") == (10.0, True, None)
    assert bench.parse_head("10+centre+warmup74") == (10.0, True, 74)
    with pytest.raises(SystemExit, match=r"--heads 10\+center"):
        bench.parse_head("10+center")


def test_a_head_without_warmup_runs_at_the_section_s(tmp_path):
    """The preset's ViLBERT entry carries its own warm-up; a head named without one takes the
    section's, so `1` and `10+centre` stay the runs they were measured as."""
    import argparse

    import yaml

    bench = _bench()
    args = argparse.Namespace(config=BENCH.parent.parent / "experiments" / "mini.yaml", out=tmp_path)
    section = yaml.safe_load(args.config.read_text())["finetune"]["refcoco"]
    assert section["families"]["vilbert"]["warmup_steps"] != section["warmup_steps"]
    for head, warmup in (("10+centre", None), ("10+centre+warmup74", 74)):
        entry = yaml.safe_load(bench.preset_with_head(args, "vilbert", head).read_text())["finetune"]["refcoco"]
        assert entry["families"]["vilbert"].get("warmup_steps") == warmup


def test_the_tables_are_written_and_the_summary_printed(tmp_path, capsys):
    import pandas as pd

    bench = _bench()
    runs = pd.DataFrame({"head": ["1", "1", "10+centre"], "test": [50.0, 60.0, 62.004]})
    summary = runs.groupby("head").agg(test_mean=("test", "mean"))
    bench.write_tables(tmp_path / "out", runs, summary, "refcoco_det:", show_runs=True)
    assert pd.read_csv(tmp_path / "out" / "summary.csv").to_dict("list") == {
        "head": ["1", "10+centre"],
        "test_mean": [55.0, 62.0],
    }
    assert len(pd.read_csv(tmp_path / "out" / "runs.csv")) == 3
    assert capsys.readouterr().out.startswith("refcoco_det:\n")
