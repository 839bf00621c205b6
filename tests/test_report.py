"""`vlbert report` on hand-made MLflow runs: it says what it lacks (missing cells and settings,
one-seed cells) and what it rests on (runs that did not finish), never a verdict without data."""

import json

import pytest
from conftest import REPO

from vlbert.cli import main
from vlbert.registry import TABLE4_TASKS

# Accuracies that follow each of the paper's findings (VCR gains most from the text corpus).
SCORES = {"no_pretrain": 40.0, "a": 45.0, "b": 50.0, "c": 48.0, "d": 55.0, "full": 60.0}


class Store:
    """A SQLite MLflow store holding fine-tuning runs as `vlbert finetune` logs them."""

    def __init__(self, tmp_path):
        from mlflow.tracking import MlflowClient

        self.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        self.client = MlflowClient(self.uri)
        self.experiment = self.client.create_experiment("vlbert-ablation-smoke")
        self.clock = 1_700_000_000_000

    def run(self, setting, task, seed, accuracy=None, status="FINISHED", tags=None, **final) -> str:
        """One run, newer than every run before it; `accuracy` None: it logged no final figures;
        `tags`: more tags; `final`: more final metrics (final_<name>)."""
        from mlflow.entities import Metric

        self.clock += 1000
        run = self.client.create_run(
            self.experiment,
            start_time=self.clock,
            run_name=f"finetune-{setting}-{task}-{seed}",
            tags={"stage": "finetune", "setting": setting, "task": task, "seed": str(seed), **(tags or {})},
        )
        if accuracy is not None:
            self.client.log_batch(
                run.info.run_id,
                metrics=[Metric(f"final_{split}_accuracy", accuracy, self.clock, 1) for split in ("val", "test")]
                + [Metric(f"final_{name}", value, self.clock, 1) for name, value in final.items()],
            )
        if status != "RUNNING":
            self.client.set_terminated(run.info.run_id, status=status)
        return run.info.run_id

    def pretrain(self, setting, status="FINISHED", seed=None, gain=10.0) -> str:
        """A pre-training run with its last epoch's validation, as `vlbert pretrain` logs it; `seed`:
        a fine-tuning seed's own (pretrain.per_seed), tagged with it."""
        from mlflow.entities import Metric

        self.clock += 1000
        run = self.client.create_run(
            self.experiment,
            start_time=self.clock,
            run_name=f"pretrain-{setting}",
            tags={"stage": "pretrain", "setting": setting} | ({} if seed is None else {"seed": str(seed)}),
        )
        values = {"val_mlm_accuracy": 30.0, "val_mlm_accuracy_other_image": 30.0 - gain, "val_visual_clue_gain": gain}
        self.client.log_batch(run.info.run_id, metrics=[Metric(k, v, self.clock, 1) for k, v in values.items()])
        if status != "RUNNING":
            self.client.set_terminated(run.info.run_id, status=status)
        return run.info.run_id


def _report(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweeps").mkdir()
    code = main(
        [
            "report",
            "--config",
            str(REPO / "experiments/smoke.yaml"),
            "--out",
            str(tmp_path / "report"),
            "--tracking-uri",
            store.uri,
            "--sweeps",
            str(tmp_path / "sweeps"),
        ]
    )
    assert code == 0
    return tmp_path / "report"


def _rows(table_md: str) -> dict:
    return {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:6]]
        for line in table_md.splitlines()
        if line.startswith("| ") and not line.startswith("| setting")
    }


@pytest.fixture
def gappy_study(tmp_path):
    """Two seeds per cell, except: setting c never ran, b has no VQA run, a's RefCOCO+ one seed."""
    store = Store(tmp_path)
    for setting, score in SCORES.items():
        for task in TABLE4_TASKS:
            if setting == "c" or (setting, task) == ("b", "vqa"):
                continue
            bonus = 1.0 if setting == "d" and task.startswith("vcr") else 0.0
            for seed in (0, 1) if (setting, task) != ("a", "refcoco_det") else (0,):
                store.run(setting, task, seed, score + bonus + seed, test_n=2000)
    return store


def test_missing_and_one_seed_cells_are_marked_and_warned(gappy_study, tmp_path, monkeypatch, capsys):
    report = _report(gappy_study, tmp_path, monkeypatch)
    err = capsys.readouterr().err
    table = (report / "table4.md").read_text()
    rows = _rows(table)
    assert rows["c"] == ["—"] * 4  # a setting without runs
    assert rows["b"][2] == "—"  # a cell without runs
    assert rows["a"][3] == "45.0 (n=1)"  # one seed: no spread to show
    assert rows["full"][0] == "60.5 ± 0.7"
    assert "± 0.0" not in table and "— no run" in table
    assert "vlbert report: warning: setting c has no fine-tuning runs" in err
    assert "b / vqa" in err and "a / refcoco_det" in err and err.count("warning:") == 3
    assert "(n=1)" in (report / "table4.tex").read_text()


def test_a_finding_without_data_is_no_data_never_a_disagreement(gappy_study, tmp_path, monkeypatch, capsys):
    report = _report(gappy_study, tmp_path, monkeypatch)
    out = capsys.readouterr().out
    findings = {f["id"]: f for f in json.loads((report / "findings.json").read_text())}
    assert findings["sirp_hurts"]["verdict"] == "no data"  # setting c never ran
    assert findings["text_helps"]["verdict"] == "no data"  # d vs b, and b has no VQA
    assert all(findings[f]["verdict"] == "agrees" for f in ("pretrain_helps", "tune_frcnn_helps"))
    # a's RefCOCO+ has one seed: against it there is no known seed spread, so no interval shows a delta
    assert findings["mrc_helps_ref"]["verdict"] == findings["mlm_helps"]["verdict"] == "not shown"
    text = (report / "findings.md").read_text()
    assert "does not agree" not in text
    assert "this run shows 2: " in text and "2 are not shown" in text and "2 have no data" in text
    assert "## sentence-image relation prediction hurts (c vs b): no data" in text
    assert "| vqa | no data |" in text
    assert "| refcoco_det | +5.50 | — | — | — | not shown | not shown |" in text
    # Two seeds a cell, their spread 0.71, the items' SE 1.1 each: a 5-point delta within [+1.6, +8.4].
    mlm = {t["task"]: t for t in findings["mlm_helps"]["tasks"]}
    assert mlm["vqa"]["low"] == pytest.approx(1.6, abs=0.1) and mlm["vqa"]["verdict"] == "helps"
    assert "2 of 6 findings agree with the paper, 2 without data" in out


def test_the_report_says_when_it_used_a_run_that_did_not_finish(tmp_path, monkeypatch, capsys):
    store = Store(tmp_path)
    for setting in SCORES:
        for task in TABLE4_TASKS:
            store.run(setting, task, 0, SCORES[setting])
    killed = store.run("a", "vqa", 1, 46.0, status="KILLED")  # logged its figures, then was killed
    running = store.run("b", "vqa", 1, 51.0, status="RUNNING")  # never closed (SIGKILL)
    store.run("d", "vqa", 0, None, status="FAILED")  # newer than d's finished seed 0
    pretrained = store.pretrain("b", status="FAILED")
    report = _report(store, tmp_path, monkeypatch)
    err = capsys.readouterr().err
    table = (report / "table4.md").read_text()
    assert _rows(table)["a"][2] == "45.5 ± 0.7"  # the killed run's figures are used ...
    for run_id, status in ((killed, "KILLED"), (running, "RUNNING")):  # ... and said so
        assert f"{run_id}" in err and f"did not finish (status {status})" in err
        assert f"{run_id}" in table and f"status {status}" in table
    assert "d / vqa / seed 0: its newest run" in err and "has no results" in err
    assert f"b: run {pretrained} did not finish (status FAILED)" in err
    assert f"run {pretrained} did not finish" in (report / "pretraining.md").read_text()


def test_a_setting_s_pre_trainings_of_each_seed_are_reported_apart_from_its_own(tmp_path, monkeypatch):
    # pretrain.per_seed: the seeds' own pre-trainings (tagged with their seed) are listed with their
    # spread; the setting's own stays its row in the main table.
    store = Store(tmp_path)
    for setting in SCORES:
        for task in TABLE4_TASKS:
            for seed in (0, 1, 2):
                store.run(setting, task, seed, SCORES[setting] + seed)
    store.pretrain("a", gain=10.0)
    store.pretrain("a", seed=1, gain=14.0)
    store.pretrain("a", seed=2, gain=18.0)
    store.pretrain("b", gain=5.0)
    report = _report(store, tmp_path, monkeypatch)
    text = (report / "pretraining.md").read_text()
    main_table = text.split("## Per word kind")[0]
    assert "| a | 30.0 | 20.0 | 10.0 |" in main_table and main_table.count("| a |") == 1
    replicates = text.split("## Every pre-training of a setting")[1]
    assert "| a | own | +10.0 |" in replicates and "| a | 2 | +18.0 |" in replicates
    assert "| a | mean ± std | +14.0 ± 4.0 |" in replicates and "| b |" not in replicates
    assert "spread holds pre-training's" in (report / "table4.md").read_text()


def test_one_pre_training_a_setting_gets_no_section_of_seeds(tmp_path, monkeypatch):
    store = Store(tmp_path)
    for setting in SCORES:
        for task in TABLE4_TASKS:
            store.run(setting, task, 0, SCORES[setting])
    store.pretrain("a")
    report = _report(store, tmp_path, monkeypatch)
    assert "Every pre-training" not in (report / "pretraining.md").read_text()
    assert "pre-training's" not in (report / "table4.md").read_text()


def test_the_report_says_why_a_run_it_used_was_ended(tmp_path, monkeypatch, capsys):
    # A killed run whose folder trained again without continuing it is ended KILLED with a note
    # (vlbert.ended); when its figures are still the newest, the report says why it ended.
    store = Store(tmp_path)
    for setting in SCORES:
        for task in TABLE4_TASKS:
            store.run(setting, task, 0, SCORES[setting])
    killed = store.run("a", "vqa", 1, 46.0, status="KILLED")
    why = "not continued, as it stopped before its first checkpoint; results/run trains again in run 123"
    store.client.set_tag(killed, "vlbert.ended", why)
    store.run("a", "vqa", 1, None, status="FAILED")
    report = _report(store, tmp_path, monkeypatch)
    assert f"run {killed} did not finish (status KILLED: {why}); its figures are used" in capsys.readouterr().err
    assert why in (report / "table4.md").read_text()


def test_the_systems_table_puts_each_system_beside_its_papers_and_checks_their_findings(tmp_path, monkeypatch):
    from mlflow.entities import Metric

    store = Store(tmp_path)
    scores = {"no_pretrain": 40.0, "c": 60.0, "full": 62.0, "vilbert_no_pretrain": 42.0, "vilbert": 58.0}
    sizes = {"full": 3.0e6, "vilbert": 3.6e6}
    for setting, score in scores.items():
        for task in TABLE4_TASKS:
            for seed in (0, 1):
                shuffled = {"test_shuffled_images_accuracy": 57.0} if setting == "vilbert" else {}
                run = store.run(setting, task, seed, score + seed, test_n=2000, **shuffled)
                if task == "refcoco_det" and setting in sizes:
                    store.client.log_batch(
                        run,
                        metrics=[
                            Metric("parameters", sizes[setting], store.clock, 1),
                            Metric("trainable_parameters", sizes[setting] / 2, store.clock, 1),
                        ],
                    )
    report = _report(store, tmp_path, monkeypatch)
    systems = (report / "systems.md").read_text()
    systems_rows = [line for line in systems.splitlines() if line.startswith(("| VL-BERT", "| ViLBERT", "| Pixel"))]
    rows = {line.split("|")[2].strip(): line for line in systems_rows}
    assert set(rows) == {"no_pretrain", "c", "full", "vilbert_no_pretrain", "vilbert"}
    assert "| ViLBERT | vilbert | 58.5 ± 0.7 |" in rows["vilbert"]
    assert "70.55 †" in rows["vilbert"] and "72.42 †" in rows["vilbert"]  # ViLBERT Table 1, recalled
    assert "| 3.60 | 1.80 |" in rows["vilbert"]
    assert "ViLBERT trains 1.80 M parameters in fine-tuning against VL-BERT's 1.50 M (+20%" in systems
    assert "vilbert_ctrl" in systems  # VOLTA's controlled comparison
    assert "pixelbert" not in rows  # no runs: no row
    # Each row's cells beside their controls: SE of the reported split, the shuffled-image score.
    controls = systems.split("## Controls: what each cell owes to the image")[1]
    assert "| vilbert | VQA | 58.5 | 1.1 | 57.0 ✗ | 1.5 |" in controls  # within two SEs of its shuffled score
    assert "| vilbert_no_pretrain | VQA | 42.5 | 1.1 | — | — |" in controls
    assert "Cells that do not clear their shuffled images: vilbert / vcr_q2a" in controls
    assert "95% interval" in (report / "systems_findings.md").read_text()
    systems_csv = (report / "systems.csv").read_text().splitlines()[0].split(",")
    assert {"vqa_se", "vqa_shuffled"} <= set(systems_csv)
    findings = {f["id"]: f for f in json.loads((report / "systems_findings.json").read_text())}
    assert findings["vilbert_pretrain_helps"]["verdict"] == "agrees"
    assert findings["two_vs_single_stream"]["verdict"] == "no sign stated"
    assert all(t["delta"] == pytest.approx(-2.0) for t in findings["two_vs_single_stream"]["tasks"])
    assert "pixel_sampling_helps" not in findings  # its settings have no runs
    assert (report / "figures" / "systems.png").stat().st_size > 0
    assert (report / "systems.csv").read_text().startswith("system,setting,")


def test_vcr_is_reported_per_kind_of_question_when_the_file_names_the_kinds(tmp_path):
    """Two `feel` questions and two `corners` ones (the fixture's two, each twice): `a` answers
    every feel question and no corners one; `no_pretrain` the reverse; the file without kinds gets
    no such table."""
    from vlbert.study.report import write_report

    lines = (REPO / "tests/fixtures/vcr/val.jsonl").read_text().splitlines()
    records = []
    for n, kind in enumerate(("feel", "feel", "corners", "corners")):
        record = json.loads(lines[n % 2])
        records.append({**record, "annot_id": f"val-{n}", "question_type": kind})
    vcr = tmp_path / "vcr"
    vcr.mkdir()
    (vcr / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    store = Store(tmp_path)
    for setting, right_kind in (("no_pretrain", "corners"), ("a", "feel")):
        for seed in (0, 1):
            for task, key, label in (
                ("vcr_q2a", "answer", "answer_label"),
                ("vcr_qa2r", "rationale", "rationale_label"),
            ):
                run_id = store.run(setting, task, seed, 50.0)
                predictions = [
                    {
                        "annot_id": r["annot_id"],
                        key: r[label] if r["question_type"] == right_kind else (r[label] + 1) % 4,
                    }
                    for r in records
                ]
                path = tmp_path / "predictions_test.json"  # VCR's reported split
                path.write_text(json.dumps(predictions))
                store.client.log_artifact(run_id, str(path))
    write_report(store.uri, "vlbert-ablation-smoke", tmp_path / "report", vcr_val=vcr / "val.jsonl")
    text = (tmp_path / "report" / "vcr_q2ar.md").read_text()
    assert "| no_pretrain | 50.0 ± 0.0 |" in text  # Q->AR: both right on the corners questions
    for task in ("VCR Q->A", "VCR QA->R"):
        section = text.split(f"### {task}\n")[1].split("###")[0]
        assert "| setting | corners (n=2) | feel (n=2) |" in section
        assert "| no_pretrain | 100.0 ± 0.0 | 0.0 ± 0.0 |" in section
        assert "| a | 0.0 ± 0.0 | 100.0 ± 0.0 |" in section

    without = [{k: v for k, v in r.items() if k != "question_type"} for r in records]
    (vcr / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in without))  # as the real VCR's
    write_report(store.uri, "vlbert-ablation-smoke", tmp_path / "real", vcr_val=vcr / "val.jsonl")
    text = (tmp_path / "real" / "vcr_q2ar.md").read_text()
    assert "| no_pretrain | 50.0 ± 0.0 |" in text and "Per kind" not in text


def test_controls_put_each_cell_beside_its_shuffled_images_and_blind_floor(tmp_path, monkeypatch):
    """Table 4's controls: a cell that its shuffled-image score or its blind floor reaches within
    two standard errors of a difference is marked and named; findings are judged against the
    larger of the seed spread and two standard errors of the difference."""
    store = Store(tmp_path)
    for setting, score in SCORES.items():
        for task in TABLE4_TASKS:
            # a's VQA reads no image: its shuffled-image score is its score
            shuffled = score - 1.0 if (setting, task) == ("a", "vqa") else 30.0
            for seed in (0, 1):
                store.run(setting, task, seed, score + seed, test_n=2000, test_shuffled_images_accuracy=shuffled)
    floors = {
        "vqa": {"reported": {"question_only": 36.6, "question_only_pairs": 0.0, "n": 2000}},
        "vcr_q2a": {"reported": {"text_only": 25.7, "option_only": 24.0, "n": 2000}},
        "vcr_qa2r": {"reported": {"text_only": 23.4, "option_only": 24.4, "n": 2000}},
        "refcoco_det": {"reported": {"no_colour_rule": 41.0, "n": 1000}},  # no_pretrain's 40.5 does not clear it
    }
    (tmp_path / "results/smoke").mkdir(parents=True)
    (tmp_path / "results/smoke/floors.json").write_text(json.dumps(floors))
    report = _report(store, tmp_path, monkeypatch)
    text = (report / "table4_controls.md").read_text()
    rows = {tuple(c.strip() for c in row.split("|")[1:3]): row for row in text.splitlines() if row.startswith("| ")}
    assert "| 45.5 | 1.1 | 44.0 ✗ | 1.5 | 36.6 |" in rows["a", "VQA"]  # SE: sqrt(.455 * .545 / 2000)
    assert "| 40.5 | 1.1 | 30.0 | 10.5 | 41.0 ✗ |" in rows["no_pretrain", "RefCOCO+ det"]
    assert _rows((report / "table4.md").read_text())["blind floor"] == ["25.7", "24.4", "36.6", "41.0"]
    assert "do not clear their shuffled images: a / vqa." in text
    assert "do not clear their blind floor: no_pretrain / refcoco_det." in text
    findings = {f["id"]: f for f in json.loads((report / "findings.json").read_text())}
    # full - d on VQA: +5.0; seeds' spread 0.71 a side, each cell's SE on its 2,000 items 1.1: t(69) x 1.71
    vqa = next(t for t in findings["tune_frcnn_helps"]["tasks"] if t["task"] == "vqa")
    assert (vqa["low"], vqa["high"]) == (pytest.approx(1.58, abs=0.02), pytest.approx(8.42, abs=0.02))
    assert vqa["verdict"] == "helps" and vqa["item_se"] == pytest.approx(1.56, abs=0.01)
    # c - b: -2.0 is beyond the seeds' spread (0.71) but its interval holds 0
    vqa = next(t for t in findings["sirp_hurts"]["tasks"] if t["task"] == "vqa")
    assert vqa["low"] < 0 < vqa["high"] and vqa["verdict"] == "not shown"


def test_runs_on_a_share_of_the_training_set_get_their_own_table_and_stay_out_of_table4(tmp_path, monkeypatch):
    store = Store(tmp_path)
    for setting, score in SCORES.items():
        for task in TABLE4_TASKS:
            for seed in (0, 1):
                store.run(setting, task, seed, score + seed, test_n=1000)
    for setting, score in (("no_pretrain", 20.0), ("full", 50.0)):  # newer runs on 10% of the data
        for task in TABLE4_TASKS:
            for seed in (0, 1):
                store.run(setting, task, seed, score + seed, tags={"train_fraction": "0.1"}, test_n=1000)
    report = _report(store, tmp_path, monkeypatch)
    assert _rows((report / "table4.md").read_text())["full"][0] == "60.5 ± 0.7"  # the whole set's runs
    text = (report / "data_fractions.md").read_text()
    assert "| VQA | 10% | 20.5 ± 0.7 | 50.5 ± 0.7 | +30.0 | [+25.8, +34.2] | — | helps |" in text
    assert "| VQA | 100% | 40.5 ± 0.7 | 60.5 ± 0.7 | +20.0 |" in text
    assert (report / "figures" / "data_fractions.png").stat().st_size > 10_000


def test_refcoco_is_reported_on_both_tracks_per_test_split_beside_the_paper(tmp_path, monkeypatch):
    """refcoco.md: every setting's RefCOCO+ on the detected regions and the ground-truth boxes,
    testA and testB apart, what the detector costs, and the ground-truth track's own controls."""
    store = Store(tmp_path)
    for setting, score in SCORES.items():
        for task in TABLE4_TASKS:
            for seed in (0, 1):
                store.run(setting, task, seed, score + seed, test_n=1000)
        for seed in (0, 1):  # the ground-truth boxes: 6 points over the detected regions
            store.run(
                setting,
                "refcoco_gt",
                seed,
                score + 6.0 + seed,
                test_n=1000,
                test_accuracy_testA=score + 9.0,
                test_accuracy_testB=score + 3.0,
                test_shuffled_images_accuracy=25.0,
                test_accuracy_rare=10.0,
                test_accuracy_seen=80.0,
            )
    report = _report(store, tmp_path, monkeypatch)
    text = (report / "refcoco.md").read_text()
    rows = {row.split("|")[1].strip(): row for row in text.splitlines() if row.startswith("| ")}
    # full: detected 60.5 (no testA/testB logged), ground truth testA 69.0, testB 63.0, both 66.5
    assert "| full | — | — | 60.5 ± 0.7 | 69.0 | 63.0 | 66.5 ± 0.7 | +6.0 |" in text
    assert "| paper (arXiv v1): VL-BERT_BASE | 77.6 | 60.6 | — | 81.3 | 71.2 | — | — |" in text  # arXiv v1
    # the ground-truth controls: SE sqrt(.665 * .335 / 1000), share 66.5 - 25.0
    assert "| full | 66.5 | 1.5 | 25.0 | 41.5 | 10.0 | 80.0 |" in text
    assert list(rows)[:7] == ["setting", *SCORES]
    assert (report / "refcoco.csv").read_text().startswith("setting,")


def _strict_json(path):
    """JSON as the standard has it: Python's own parser takes bare NaN and Infinity tokens."""

    def refuse(token):
        raise ValueError(f"{path}: {token} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_the_reports_json_is_strict_with_null_for_a_missing_value(tmp_path, monkeypatch):
    # Seen: 21 bare NaN tokens in the smoke study's findings.json, wherever a cell had one seed or
    # no runs, and 10 in systems_findings.json.
    store = Store(tmp_path)
    scores = {"no_pretrain": 40.0, "c": 60.0, "full": 62.0, "vilbert_no_pretrain": 42.0, "vilbert": 58.0}
    for setting, score in scores.items():
        for task in TABLE4_TASKS:
            if (setting, task) != ("vilbert", "vqa"):
                store.run(setting, task, 0, score)  # one seed each: no spread anywhere
    report = _report(store, tmp_path, monkeypatch)
    written = sorted(report.rglob("*.json"))
    assert {p.name for p in written} >= {"findings.json", "systems_findings.json"}
    parsed = {p.name: _strict_json(p) for p in written}
    tasks = [t for f in parsed["findings.json"] + parsed["systems_findings.json"] for t in f["tasks"]]
    assert tasks and all(t["low"] is None and t["high"] is None for t in tasks)  # one seed: no interval
    systems = {f["id"]: f for f in parsed["systems_findings.json"]}
    vqa = next(t for t in systems["vilbert_pretrain_helps"]["tasks"] if t["task"] == "vqa")
    assert vqa["delta"] is None and vqa["missing"] == ["vilbert"]


def test_a_run_whose_process_is_gone_is_ended_and_its_cell_shown_killed(tmp_path, monkeypatch, capsys):
    # Seen: a SIGKILLed fine-tuning job's run stayed RUNNING, its cell `-` as if it never ran.
    import subprocess
    import sys

    from vlbert.tracking import ENDED_TAG, PID_TAG, process_tags

    store = Store(tmp_path)
    for setting in SCORES:
        for task in TABLE4_TASKS:
            if (setting, task) != ("c", "vqa"):
                store.run(setting, task, 0, SCORES[setting])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    killed = store.run("c", "vqa", 0, None, status="RUNNING", tags={**process_tags(), PID_TAG: str(gone.pid)})
    report = _report(store, tmp_path, monkeypatch)
    err = capsys.readouterr().err
    run = store.client.get_run(killed)
    assert run.info.status == "KILLED" and f"PID {gone.pid}" in run.data.tags[ENDED_TAG]
    table = (report / "table4.md").read_text()
    assert _rows(table)["c"][2] == "killed" and _rows(table)["c"][0] != "killed"
    assert f"c / vqa / seed 0: run {killed} was killed before it had results (its process (PID {gone.pid}" in table
    assert "runs killed before they had results for c / vqa: killed in Table 4" in err
    assert "no run with results" not in err
