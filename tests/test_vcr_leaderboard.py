"""`vlbert vcr-leaderboard`: the leaderboard's CSV from a Q->A and a QA->R run, on the generated VCR.

The runs are made by hand (a tiny VL-BERT, stores of random features, no detector): what is tested
is that the rationale scores after each answer are the QA->R model's, with inputs built as in
fine-tuning, and that the CSV scores as the project's predictions do.
"""

import contextlib
import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import REPO

from vlbert.cli import main
from vlbert.data.feature_store import write_shard

PRESET = REPO / "experiments" / "smoke.yaml"
FEATURE_DIM = 8


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from vlbert import tasks
    from vlbert.config import load_config, synthetic_spec
    from vlbert.data.synthetic import make_world
    from vlbert.data.vcr import read_vcr
    from vlbert.engine.build import load_processor
    from vlbert.engine.finetune import predict
    from vlbert.modeling import VLBertConfig, VLBertForVCR
    from vlbert.modeling.pretrained import init_weights
    from vlbert.modeling.processing_study import default_tokenizer_path

    root = tmp_path_factory.mktemp("vcr_leaderboard")
    make_world(synthetic_spec(load_config(PRESET)), root / "data", datasets=["vcr"], progress=False)
    # A gt-box store of the test split: the whole image, then one row per VCR object.
    examples = read_vcr(root / "data" / "vcr" / "test.jsonl")
    rng = np.random.default_rng(0)
    keys, results = [], []
    for e in examples:
        n = 1 + len(e.objects)
        keys.append(str(e.image_path.relative_to(root / "data" / "vcr" / "vcr1images")))
        corner = rng.uniform(0, 48, (n, 2))
        boxes = np.concatenate([corner, corner + rng.uniform(8, 48, (n, 2))], 1).astype(np.float32)
        features = rng.normal(size=(n, FEATURE_DIM)).astype(np.float32)
        results.append(
            SimpleNamespace(
                boxes=boxes,
                labels=np.zeros(n, np.int64),
                probs=np.zeros((n, 7), np.float32),
                scores=np.ones(n, np.float32),
                features=features,
                box_ids=np.arange(-1, n - 1),
                width=96,
                height=96,
            )
        )
    write_shard(
        root / "features" / "vcr.test.gt.h5",
        keys,
        results,
        [],
        {"dataset": "vcr", "split": "test", "mode": "gt", "feature_dim": FEATURE_DIM},
        dtype="float32",
    )

    tokenizer = default_tokenizer_path()
    processor = load_processor(tokenizer, 40)
    runs = {}
    for seed, task_name in enumerate(("vcr_q2a", "vcr_qa2r")):
        torch.manual_seed(seed)
        model = VLBertForVCR(
            VLBertConfig(
                vocab_size=len(processor.tokenizer),
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                visual_feature_dim=FEATURE_DIM,
            )
        )
        for module in model.modules():  # BERT's N(0, 0.02) gives every choice about 0.25 whatever the input
            init_weights(module, std=0.5)
        run = root / task_name
        model.save_pretrained(run / "best")
        task = tasks.build(task_name, processor, root / "data", root / "features")
        predictions = predict(model.eval(), task, task.examples("test"), 8)
        (run / "predictions_test.json").write_text(json.dumps(predictions))
        (run / "metrics.json").write_text(json.dumps({"setting": "no_pretrain", "task": task_name, "seed": 0}))
        runs[task_name] = run
    return SimpleNamespace(
        root=root,
        data=root / "data",
        features=root / "features",
        tokenizer=tokenizer,
        q2a=runs["vcr_q2a"],
        qa2r=runs["vcr_qa2r"],
        examples=examples,
    )


def _leaderboard(runs, out, *extra):
    # Run from the runs' folder: the stores are random features, which the study's detector (the
    # default, results/<preset>/detector, where a study was run in this folder) would refuse.
    with contextlib.chdir(runs.root):
        return _leaderboard_here(runs, out, *extra)


def _leaderboard_here(runs, out, *extra):
    return main(
        [
            "vcr-leaderboard",
            "--config",
            str(PRESET),
            "--q2a",
            str(runs.q2a),
            "--qa2r",
            str(runs.qa2r),
            "--data",
            str(runs.data),
            "--features",
            str(runs.features),
            "--bert",
            str(runs.tokenizer),
            "--out",
            str(out),
            *extra,
        ]
    )


def test_the_csv_holds_the_answer_scores_and_the_rationale_scores_after_each_answer(runs, tmp_path, capsys):
    out = tmp_path / "submission.csv"
    assert _leaderboard(runs, out) == 0
    printed = capsys.readouterr().out
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    # The columns of r2c's eval_for_leaderboard.py, one row per question in the split's order.
    assert rows[0] == (
        ["annot_id", "answer_0", "answer_1", "answer_2", "answer_3"]
        + [f"rationale_conditioned_on_a{i}_{j}" for i in range(4) for j in range(4)]
    )
    assert [r[0] for r in rows[1:]] == [e.annot_id for e in runs.examples]
    answers = {p["annot_id"]: p["answer_probs"] for p in json.loads((runs.q2a / "predictions_test.json").read_text())}
    after_right = {
        p["annot_id"]: p["rationale_probs"] for p in json.loads((runs.qa2r / "predictions_test.json").read_text())
    }
    differs = 0
    for row, e in zip(rows[1:], runs.examples):
        values = np.array(row[1:], dtype=np.float64)
        assert values[:4].tolist() == answers[e.annot_id]
        after = values[4:].reshape(4, 4)
        # After the right answer: what fine-tuning's QA->R predictions hold, input for input.
        np.testing.assert_allclose(after[e.answer_label], after_right[e.annot_id], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(after.sum(1), 1.0, rtol=1e-5)
        differs += not np.allclose(after, after[e.answer_label])
    assert differs > len(runs.examples) // 2  # after another answer, other inputs and other scores

    # The CSV scored as the leaderboard scores it equals the project's JSON predictions' figures.
    assert (
        main(
            [
                "evaluate",
                "vcr",
                "--annotations",
                str(runs.data / "vcr" / "test.jsonl"),
                "--predictions",
                str(runs.q2a / "predictions_test.json"),
                str(runs.qa2r / "predictions_test.json"),
            ]
        )
        == 0
    )
    figures = capsys.readouterr().out.split("VCR accuracy: ")[1].strip()
    assert f"scored as the leaderboard scores it: {figures}" in printed
    assert (
        main(["evaluate", "vcr", "--annotations", str(runs.data / "vcr" / "test.jsonl"), "--predictions", str(out)])
        == 0
    )
    assert f"VCR accuracy: {figures}" in capsys.readouterr().out


def test_a_q2a_run_without_every_question_is_refused(runs, tmp_path, capsys):
    partial = tmp_path / "q2a"
    partial.mkdir()
    (partial / "metrics.json").write_text((runs.q2a / "metrics.json").read_text())
    predictions = json.loads((runs.q2a / "predictions_test.json").read_text())
    (partial / "predictions_test.json").write_text(json.dumps(predictions[1:]))
    assert _leaderboard(SimpleNamespace(**{**vars(runs), "q2a": partial}), tmp_path / "out.csv") == 2
    err = capsys.readouterr().err
    assert (
        f"q2a/predictions_test.json: no prediction for 1 of the {len(runs.examples)} annot_ids "
        f"({runs.examples[0].annot_id!r})" in err
    )
    assert not (tmp_path / "out.csv").exists()


def test_runs_of_the_wrong_task_are_refused(runs, tmp_path, capsys):
    swapped = SimpleNamespace(**{**vars(runs), "q2a": runs.qa2r, "qa2r": runs.q2a})
    assert _leaderboard(swapped, tmp_path / "out.csv") == 2
    assert "vcr_q2a/metrics.json [task]: a run of task 'vcr_q2a', expected a vcr_qa2r run" in capsys.readouterr().err
