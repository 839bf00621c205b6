"""Presets: load a YAML file, validate it against the one schema, resolve defaults.

Every error names the preset file and the dotted key at fault, e.g.
`experiments/mini.yaml: data.synthetic.vqa.trian: unknown key`.
"""

from __future__ import annotations

import math
import os
from importlib import resources
from pathlib import Path

import jsonschema
import yaml

from .layout import Layout
from .registry import family_settings, setting, task

SCHEMA_FILE = "config.schema.yaml"
# Where a folder the study writes into (make-data writes a folder per data set there) must not be:
# anywhere in these system trees, or at one of these folders itself.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr")
SYSTEM_FOLDERS = ("/", "/home", "/media", "/mnt", "/opt", "/root", "/srv", "/tmp", "/var")


class ConfigError(ValueError):
    pass


def load_schema() -> dict:
    return yaml.safe_load(resources.files("vlbert.schemas").joinpath(SCHEMA_FILE).read_text())


def _dotted(parts) -> str:
    return ".".join(str(p) for p in parts) or "<top level>"


def _describe(error: jsonschema.ValidationError) -> str:
    where = list(error.absolute_path)
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return f"{_dotted(where + [extra[0]])}: unknown key"
    if error.validator == "unevaluatedProperties":  # a section built from shared fields: the message names the key
        extra = error.message.split("'")[1]
        return f"{_dotted(where + [extra])}: unknown key"
    if error.validator == "required":
        missing = error.message.split("'")[1]
        return f"{_dotted(where + [missing])}: missing required key"
    return f"{_dotted(where)}: {error.message}"


def _non_finite(value, where: tuple = ()):
    """The key path of the first NaN or infinity in a preset (YAML's .nan, .inf), else None: the
    schema's bounds let NaN through (every comparison with it is false)."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, (*where, key))
        if found is not None:
            return found
    return None


def validate(config: dict, source: str = "<config>") -> None:
    where = _non_finite(config)
    if where is not None:
        value = config
        for key in where:
            value = value[key]
        raise ConfigError(f"{source}: {_dotted(where)}: {value} is not a finite number")
    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if errors:
        # `if/then` failures wrap the useful error; report the innermost one.
        error = errors[0]
        while error.context:
            error = min(error.context, key=lambda e: len(e.absolute_path))
        raise ConfigError(f"{source}: {_describe(error)}")
    for family, entry in config.get("finetune", {}).get("vqa", {}).get("families", {}).items():
        if "centre_candidates" in entry:  # the schema's family entry is every section's
            raise ConfigError(f"{source}: finetune.vqa.families.{family}.centre_candidates: unknown key")
    vcr = config.get("finetune", {}).get("vcr", {})
    if vcr.get("task_epochs") and vcr.get("schedule") == "step":
        raise ConfigError(
            f"{source}: finetune.vcr.task_epochs: a step schedule's step_epochs count the section's epochs, "
            "not a task's own: use a linear_decay schedule with task_epochs"
        )
    if "root" in config["data"]:
        check_output(config["data"]["root"], "data.root", source)
    if config.get("pretrain", {}).get("per_seed") and study_seeds(config)[0] != config["seed"]:
        raise ConfigError(
            f"{source}: pretrain.per_seed: the first of sweep.seeds ({study_seeds(config)[0]}) must be the "
            f"preset's seed ({config['seed']}): its runs start from the setting's own pre-training, made with it"
        )


def unsafe_output(path) -> str | None:
    """Why `path` must not be a folder the study writes into, else None: the package's own source,
    the home folder itself, or a system path. Checked on the path as written and as resolved
    (symlinks, `..`), relative paths from the working folder."""
    package = Path(__file__).resolve().parent
    home = Path.home().resolve()
    for candidate in {Path(os.path.abspath(os.path.expanduser(path))), Path(path).expanduser().resolve()}:
        if candidate == package or package in candidate.parents:
            return f"inside the package's source ({package})"
        if candidate == home:
            return "the home folder itself"
        if str(candidate) in SYSTEM_FOLDERS or any(
            candidate == Path(tree) or Path(tree) in candidate.parents for tree in SYSTEM_TREES
        ):
            return "a system folder"
    return None


def check_output(path, key: str, source: str | None = None) -> None:
    """Refuse an output folder `unsafe_output` names, naming its key (or option) and preset."""
    why = unsafe_output(path)
    if why:
        where = f"{source}: " if source else ""
        raise ConfigError(f"{where}{key}: {path} is {why}: give the study a folder of its own")


def existing_paths(config: dict) -> dict[str, str]:
    """The dotted keys of every path the preset says must exist, with their values."""
    paths = {}
    if config["data"]["source"] == "real":
        paths.update({f"data.paths.{k}": v for k, v in config["data"]["paths"].items()})
    d2 = config.get("detector", {}).get("detectron2")
    if d2 and config["detector"].get("backend") == "detectron2":
        paths.update({f"detector.detectron2.{k}": v for k, v in d2.items()})
    return paths


def check_paths(config: dict, source: str = "<config>") -> None:
    for key, value in existing_paths(config).items():
        if not Path(value).exists():
            raise ConfigError(f"{source}: {key}: path does not exist: {value}")


def load_config(path, check_paths_exist: bool = False) -> dict:
    """Load and validate a preset; with `check_paths_exist`, every data path must exist."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"preset not found: {path}")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{line}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: a preset is a mapping of keys, got {type(config).__name__}")
    validate(config, str(path))
    if check_paths_exist:
        check_paths(config, str(path))
    config.setdefault("data", {}).setdefault("root", str(Layout(config["name"]).data))
    return config


def dataset_root(config: dict, dataset: str) -> Path:
    """Where a data set lives: under data.root for the synthetic world, data.paths for real data."""
    if config["data"]["source"] == "synthetic":
        return Path(config["data"]["root"]) / dataset
    try:
        return Path(config["data"]["paths"][dataset])
    except KeyError:
        raise ConfigError(f"preset {config['name']!r}: data.paths.{dataset}: missing required key") from None


def synthetic_spec(config: dict) -> dict:
    """What the synthetic world generator needs: the data.synthetic section plus the seed."""
    if config["data"]["source"] != "synthetic":
        raise ConfigError(
            f"preset {config['name']!r} uses real data (data.source: real); make-data writes only the synthetic world"
        )
    return {"seed": config["seed"], **config["data"]["synthetic"]}


def study_settings(config: dict) -> tuple[str, ...]:
    """The settings the study runs: those of the preset's `systems` (model families; VL-BERT's
    Table 4 rows when absent)."""
    return family_settings(config.get("systems", ["vlbert"]))


def study_seeds(config: dict) -> list[int]:
    """The seeds the chosen learning rates are re-run with (`sweep.seeds`, else the preset's
    seed); sweep trials use the first."""
    return list(config.get("sweep", {}).get("seeds", [config["seed"]]))


def pretraining_seed(config: dict, seed: int) -> int | None:
    """The seed of the pre-training that fine-tuning seed `seed` starts from when it has one of its
    own (`pretrain.per_seed`: every seed but the first), else None: the setting's own pre-training,
    made with the preset's seed, the one its sweeps use."""
    if not config.get("pretrain", {}).get("per_seed") or seed == study_seeds(config)[0]:
        return None
    return seed


def data_fractions(config: dict) -> tuple[list[float], list[str]]:
    """The shares of each training set that `finetune.data_fractions` fine-tunes its settings on
    (those of the study), and those settings; none when the preset has no such section."""
    section = config.get("finetune", {}).get("data_fractions")
    if not section:
        return [], []
    for name in section["settings"]:
        setting(name)  # an unknown name is refused, naming the known ones
    studied = study_settings(config)
    return list(section["fractions"]), [s for s in section["settings"] if s in studied]


def pretrain_curriculum(config: dict, setting_name: str) -> dict | None:
    """`pretrain.curriculum` where it names `setting_name` (its first epochs on the captions of
    images with few objects), else None."""
    section = config.get("pretrain", {}).get("curriculum")
    if not section:
        return None
    for name in section["settings"]:
        setting(name)  # an unknown name is refused, naming the known ones
    epochs = config["pretrain"].get("epochs")
    if epochs is not None and section["epochs"] >= epochs:
        raise ConfigError(
            f"pretrain.curriculum.epochs ({section['epochs']}) must be under pretrain.epochs ({epochs}): "
            "the curriculum is how a run starts"
        )
    return section if setting_name in section["settings"] else None


def finetune_options(config: dict, task_name: str, family: str | None = None) -> dict:
    """The task's section of `finetune` (optimiser, schedule, epochs, batch size); for a model
    `family`, with its `families.<family>` entry's rates and head (`lr`, `warmup_steps`,
    `head_lr_factor`, `centre_candidates`; and ViLBERT's `tag_coattention_mask`) in place of the section's (the
    schema admits nothing else there: the epochs, which `finetune_epochs` reads without a family,
    are every system's). The `families` entry itself is not among the options; a VCR task's own
    epochs (`task_epochs`) are its `epochs`."""
    section = config["finetune"][task(task_name).options_key]
    own = section.get("families", {}).get(family, {}) if family is not None else {}
    options = {**{key: value for key, value in section.items() if key not in ("families", "task_epochs")}, **own}
    if task_name in section.get("task_epochs", {}):
        options["epochs"] = section["task_epochs"][task_name]
    return options


def finetune_epochs(config: dict, task_name: str) -> int:
    """The epochs a task fine-tunes for: its section's, times `finetune.epoch_factor` (Table 4: 0.5)."""
    factor = config["finetune"].get("epoch_factor", 1.0)
    return max(1, round(finetune_options(config, task_name)["epochs"] * factor))
