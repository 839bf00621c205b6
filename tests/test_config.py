import re

import pytest
import yaml
from conftest import REPO

from vlbert.config import ConfigError, load_config


@pytest.mark.parametrize("preset", ["smoke", "mini", "paper"])
def test_every_preset_validates(preset):
    config = load_config(REPO / "experiments" / f"{preset}.yaml")
    assert config["name"] == preset


def _write(tmp_path, config):
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _smoke():
    return yaml.safe_load((REPO / "experiments" / "smoke.yaml").read_text())


def test_unknown_key_is_named(tmp_path):
    config = _smoke()
    config["data"]["synthetic"]["vqa"]["trian"] = 5
    with pytest.raises(ConfigError, match=r"preset\.yaml: data\.synthetic\.vqa\.trian: unknown key"):
        load_config(_write(tmp_path, config))


@pytest.mark.parametrize(
    ("section", "key"),
    [
        (("finetune", "vqa"), "standardise_head_inptu"),
        (("pretrain",), "standardise_head_input"),
        (("pretrain",), "dropout"),
    ],
)
def test_a_key_an_optimiser_section_does_not_take_is_named(tmp_path, section, key):
    """Pre-training has no new head: the fine-tuning head's keys are unknown there, as a typo is."""
    config = _smoke()
    target = config
    for name in section:
        target = target.setdefault(name, {})
    target[key] = True if key.startswith("standardise") else 0.0
    where = re.escape(".".join((*section, key)))
    with pytest.raises(ConfigError, match=rf"preset\.yaml: {where}: unknown key"):
        load_config(_write(tmp_path, config))


def test_a_fine_tuning_task_takes_its_head_keys(tmp_path):
    config = _smoke()
    config["finetune"]["vqa"] |= {"standardise_head_input": True, "dropout": 0.0, "head_lr_factor": 10}
    assert load_config(_write(tmp_path, config))["finetune"]["vqa"]["dropout"] == 0.0


def test_a_vcr_task_takes_its_own_epochs_for_every_family(tmp_path):
    from vlbert.config import finetune_epochs, finetune_options

    config = _smoke()
    config["finetune"]["vcr"] |= {"task_epochs": {"vcr_qa2r": 3}, "schedule": "linear_decay"}
    loaded = load_config(_write(tmp_path, config))
    factor = config["finetune"].get("epoch_factor", 1.0)
    assert finetune_options(loaded, "vcr_qa2r", "vilbert")["epochs"] == 3
    assert "task_epochs" not in finetune_options(loaded, "vcr_qa2r")
    assert finetune_epochs(loaded, "vcr_qa2r") == max(1, round(3 * factor))
    assert finetune_options(loaded, "vcr_q2a")["epochs"] == config["finetune"]["vcr"]["epochs"]
    config["finetune"]["vcr"]["task_epochs"] = {"vqa": 3}
    with pytest.raises(ConfigError, match=r"finetune\.vcr\.task_epochs"):
        load_config(_write(tmp_path, config))
    config["finetune"]["vcr"] |= {"task_epochs": {"vcr_qa2r": 3}, "schedule": "step", "step_epochs": [2]}
    with pytest.raises(ConfigError, match=r"finetune\.vcr\.task_epochs: a step schedule's step_epochs"):
        load_config(_write(tmp_path, config))


def test_a_family_entry_takes_its_rates_and_nothing_of_the_budget(tmp_path):
    """finetune.<section>.families: a system's own rate and head rate; its epochs stay the section's."""
    from vlbert.config import finetune_options

    config = _smoke()
    entry = {"lr": 2e-4, "warmup_steps": 74, "head_lr_factor": 10, "centre_candidates": True}
    config["finetune"]["refcoco"]["families"] = {"vilbert": entry}
    loaded = load_config(_write(tmp_path, config))
    vilbert = finetune_options(loaded, "refcoco_det", "vilbert")
    vlbert = finetune_options(loaded, "refcoco_gt", "vlbert")
    assert {key: vilbert[key] for key in entry} == entry
    assert vlbert["lr"] == config["finetune"]["refcoco"]["lr"]
    assert "head_lr_factor" not in vlbert and "centre_candidates" not in vlbert
    assert vlbert["warmup_steps"] == config["finetune"]["refcoco"]["warmup_steps"] != 74
    config["finetune"]["refcoco"]["families"]["vilbert"]["epochs"] = 3
    with pytest.raises(ConfigError, match=r"preset\.yaml: finetune\.refcoco\.families\.vilbert\.epochs: unknown key"):
        load_config(_write(tmp_path, config))
    del config["finetune"]["refcoco"]["families"]["vilbert"]["epochs"]
    config["finetune"]["vqa"]["families"] = {"vilbert": {"centre_candidates": True}}  # no candidates
    with pytest.raises(
        ConfigError, match=r"preset\.yaml: finetune\.vqa\.families\.vilbert\.centre_candidates: unknown"
    ):
        load_config(_write(tmp_path, config))


def test_vcr_and_refcoco_alone_take_centred_candidates(tmp_path):
    config = _smoke()
    config["finetune"]["vcr"]["centre_candidates"] = True
    config["finetune"]["refcoco"]["centre_candidates"] = True
    loaded = load_config(_write(tmp_path, config))
    assert loaded["finetune"]["vcr"]["centre_candidates"] is loaded["finetune"]["refcoco"]["centre_candidates"] is True
    config["finetune"]["vqa"]["centre_candidates"] = True  # VQA has no candidates to centre
    with pytest.raises(ConfigError, match=r"preset\.yaml: finetune\.vqa\.centre_candidates: unknown key"):
        load_config(_write(tmp_path, config))


def test_wrong_type_is_named(tmp_path):
    config = _smoke()
    config["data"]["synthetic"]["image_size"] = "big"
    with pytest.raises(ConfigError, match=r"data\.synthetic\.image_size: 'big' is not of type 'integer'"):
        load_config(_write(tmp_path, config))


def test_fractional_epochs_are_refused(tmp_path):
    # Seen: `pretrain.epochs: 0.3` ran 0 steps and exited 0 with no model.
    config = _smoke()
    config["pretrain"]["epochs"] = 0.3
    with pytest.raises(ConfigError, match=r"pretrain\.epochs: 0\.3 is not of type 'integer'"):
        load_config(_write(tmp_path, config))


NON_FINITE = {
    "pretrain.lr": (("pretrain", "lr"), float("nan")),
    "sweep.lrs.vqa.0": (("sweep", "lrs", "vqa", 0), float("inf")),
    "training.grad_clip": (("training", "grad_clip"), float("nan")),
    "finetune.epoch_factor": (("finetune", "epoch_factor"), float("inf")),
    "finetune.vqa.weight_decay": (("finetune", "vqa", "weight_decay"), float("-inf")),
}


@pytest.mark.parametrize("key", list(NON_FINITE))
def test_non_finite_numbers_are_refused_naming_the_key(key, tmp_path):
    # Seen: NaN and inf passed the schema's bounds (every comparison with NaN is false), exit 0.
    where, value = NON_FINITE[key]
    config = _smoke()
    section = config
    for part in where[:-1]:
        section = section[part]
    section[where[-1]] = value
    with pytest.raises(ConfigError, match=rf"preset\.yaml: {re.escape(key)}: -?(nan|inf) is not a finite number"):
        load_config(_write(tmp_path, config))


def test_a_nan_rate_stops_the_cli_with_exit_2(tmp_path, capsys):
    from vlbert.cli import main

    path = tmp_path / "preset.yaml"
    path.write_text(
        (REPO / "experiments" / "smoke.yaml")
        .read_text()
        .replace(
            "lr: 1.0e-3, cnn_lr_factor: 0.1, weight_decay: 1.0e-4, warmup_steps: 2, schedule: linear_decay, epochs: 1",
            "lr: .nan, cnn_lr_factor: 0.1, weight_decay: 1.0e-4, warmup_steps: 2, schedule: linear_decay, epochs: 1",
        )
    )
    assert "lr: .nan" in path.read_text()
    assert main(["make-data", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"vlbert make-data: error: {path}: pretrain.lr: nan is not a finite number\n"


def test_missing_required_key_is_named(tmp_path):
    config = _smoke()
    del config["data"]["synthetic"]["vcr"]
    with pytest.raises(ConfigError, match=r"data\.synthetic\.vcr: missing required key"):
        load_config(_write(tmp_path, config))


def test_missing_path_is_named(tmp_path):
    config = yaml.safe_load((REPO / "experiments" / "paper.yaml").read_text())
    for key in config["data"]["paths"]:
        (tmp_path / key).mkdir()
        config["data"]["paths"][key] = str(tmp_path / key)
    config["detector"]["detectron2"] = {"config": str(tmp_path / "vqa"), "weights": str(tmp_path / "vqa")}
    load_config(_write(tmp_path, config), check_paths_exist=True)  # all there: fine
    config["data"]["paths"]["vcr"] = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"data\.paths\.vcr: path does not exist: .*nowhere"):
        load_config(_write(tmp_path, config), check_paths_exist=True)


def test_placeholder_paths_fail_only_when_checked():
    load_config(REPO / "experiments" / "paper.yaml")
    with pytest.raises(ConfigError, match=r"data\.paths\.\S+: path does not exist: /path/to/"):
        load_config(REPO / "experiments" / "paper.yaml", check_paths_exist=True)


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: smoke\nseed: [0\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml:\d+: invalid YAML"):
        load_config(path)


def test_loading_section_is_not_part_of_a_run_identity():
    """How batches are built does not change them: the paper's loader workers live outside
    `training`, which checkpoints and the workflow's rules depend on."""
    from vlbert.engine.loop import LoopConfig, loading_options

    config = load_config(REPO / "experiments" / "paper.yaml")
    assert "workers" in config["loading"] and not {"workers", "loader_workers"} & set(config["training"])
    loop = LoopConfig(1, 1, **config["training"], **loading_options(config))
    assert (loop.loader_workers, loop.prefetch_batches) == (
        config["loading"]["workers"],
        config["loading"]["prefetch_batches"],
    )


UNSAFE_ROOTS = {
    "/": "a system folder",
    "/etc": "a system folder",
    "/usr/share/data": "a system folder",
    "~": "the home folder itself",
    str(REPO / "vlbert"): "inside the package's source",
    str(REPO / "vlbert" / "data"): "inside the package's source",
    "vlbert": "inside the package's source",  # relative to the folder the study runs in
}


@pytest.mark.parametrize("root", list(UNSAFE_ROOTS))
def test_a_data_root_at_a_system_path_or_in_the_package_is_refused(root, tmp_path, monkeypatch):
    # Seen: `root: vlbert` wrote into the package source; `root: /` planned `make-data --out //`.
    monkeypatch.chdir(REPO)
    config = _smoke()
    config["data"]["root"] = root
    with pytest.raises(ConfigError, match=rf"preset\.yaml: data\.root: {re.escape(root)} is {UNSAFE_ROOTS[root]}"):
        load_config(_write(tmp_path, config))


def test_a_data_root_of_its_own_is_fine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for root in (str(tmp_path / "data"), "results/x/data", "~/vlbert-data"):
        config = _smoke()
        config["data"]["root"] = root
        assert load_config(_write(tmp_path, config))["data"]["root"] == root


def _differ(where: str, schema_keys, registry_keys) -> list[str]:
    """Each key one side has and the other lacks, by its path in a preset."""
    missing, extra = sorted(set(registry_keys) - set(schema_keys)), sorted(set(schema_keys) - set(registry_keys))
    return [f"{where}.{k}: in vlbert/registry.py, missing from the schema" for k in missing] + [
        f"{where}.{k}: in the schema, not in vlbert/registry.py" for k in extra
    ]


def test_the_schema_names_the_registry_s_tasks_families_and_data_sets():
    """A schema is data and cannot read the registry, so it restates these keys: a task's
    options_key, a family or a data set added without its schema entry fails here, by name."""
    from vlbert.config import load_schema
    from vlbert.registry import DATASETS, FAMILIES, TASKS

    schema = load_schema()["properties"]
    options_keys = {spec.options_key for spec in TASKS.values()}
    finetune = schema["finetune"]["properties"]
    task_refs = ("#/$defs/finetune_task", "#/$defs/finetune_fields")  # VCR's adds its own key to the fields
    task_sections = [key for key, section in finetune.items() if section.get("$ref") in task_refs]
    (lrs,) = [form for form in schema["sweep"]["properties"]["lrs"]["oneOf"] if form.get("type") == "object"]
    synthetic = schema["data"]["properties"]["synthetic"]
    fields = load_schema()["$defs"]["finetune_fields"]["properties"]
    family_lrs = schema["sweep"]["properties"]["family_lrs"]
    differ = [
        *_differ("finetune", task_sections, options_keys),
        *_differ("sweep.lrs", lrs["properties"], options_keys),
        *_differ("sweep.lrs", lrs["required"], options_keys),  # its per-section form takes every key
        *_differ("systems", schema["systems"]["items"]["enum"], FAMILIES),
        *_differ("finetune.<section>.reinitialise", fields["reinitialise"]["propertyNames"]["enum"], FAMILIES),
        *_differ("finetune.<section>.families", fields["families"]["propertyNames"]["enum"], FAMILIES),
        *_differ("sweep.family_lrs", family_lrs["propertyNames"]["enum"], FAMILIES),
        *_differ("sweep.family_lrs.<family>", family_lrs["additionalProperties"]["properties"], options_keys),
        *_differ("data.synthetic", set(synthetic["required"]) - {"image_size"}, DATASETS),
        *_differ("data.paths", schema["data"]["properties"]["paths"]["properties"], DATASETS),
    ]
    assert not differ, "\n".join(dict.fromkeys(differ))


def test_with_per_seed_pre_training_each_seed_but_the_first_has_its_own(tmp_path):
    from vlbert.config import pretraining_seed
    from vlbert.engine.context import run_inputs
    from vlbert.layout import Layout
    from vlbert.registry import SETTINGS

    config = _smoke()
    config["sweep"]["seeds"] = [0, 3, 5]
    assert [pretraining_seed(config, s) for s in (0, 3, 5)] == [None, None, None]
    config["pretrain"]["per_seed"] = True
    config = load_config(_write(tmp_path, config))
    assert [pretraining_seed(config, s) for s in (0, 3, 5)] == [None, 3, 5]
    layout = Layout("smoke")
    assert run_inputs(config, SETTINGS["a"], seed=0).pretrained == layout.pretrained("a")
    assert run_inputs(config, SETTINGS["a"], seed=5).pretrained == layout.pretrain("a") / "seed5" / "best"
    assert run_inputs(config, SETTINGS["no_pretrain"], seed=5).pretrained is None


def test_per_seed_pre_training_needs_the_preset_s_seed_first(tmp_path):
    # The first seed's runs continue the sweep's trials, made from the setting's own pre-training.
    config = _smoke()
    config["pretrain"]["per_seed"] = True
    config["sweep"]["seeds"] = [1, 2]
    with pytest.raises(
        ConfigError, match=r"pretrain\.per_seed: the first of sweep\.seeds \(1\) must be the preset's seed \(0\)"
    ):
        load_config(_write(tmp_path, config))


def test_per_seed_is_not_part_of_a_pre_training_s_identity(smoke_study):
    from vlbert.engine.context import run_inputs, training_context
    from vlbert.engine.pretrain import PretrainStage
    from vlbert.registry import SETTINGS
    from vlbert.tracking import NullTracker

    identities = []
    for per_seed in (False, True):
        config = load_config(smoke_study["preset"])
        config["data"]["root"] = str(smoke_study["data"])
        config["pretrain"]["per_seed"] = per_seed
        inputs = run_inputs(
            config,
            SETTINGS["a"],
            features_dir=smoke_study["features"],
            bert=smoke_study["bert"],
            detector_dir=smoke_study["detector"],
        )
        stage = PretrainStage(training_context(config, inputs, NullTracker, progress=False), SETTINGS["a"], "unused")
        stage.setup()
        identities.append(stage.identity())
    assert identities[0] == identities[1]
