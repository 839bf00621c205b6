"""The model families on transformers' Auto classes, without importing transformers at `import vlbert`.

After `import vlbert`, AutoConfig and AutoModel / AutoModelForPreTraining .from_pretrained(folder)
load a checkpoint the study wrote. Registering there and then would import transformers' Auto
classes, and torch with them (seconds for `vlbert --help`), so `import vlbert` only arranges it:

- every family's model_type (vlbert.registry.FAMILIES: "vlbert", "vilbert", "pixelbert") goes on
  AutoConfig once transformers has loaded AutoConfig's module (at once if it has already). Not
  while transformers is still loading it: transformers loads it on the way to AutoModel, and a
  configuration class cannot be made before AutoModel's module is whole (BertConfig's docstring
  asks it). So a finder on sys.meta_path lets transformers' modules load as they would, counts
  those running, and registers when none is.
- the models go on AutoModel and AutoModelForPreTraining when the first config is made
  (from_pretrained makes the config before it looks for the model class): they import
  transformers' BERT, which must not be in the middle of its own loading either.
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder

from . import registry  # plain dataclasses: `import vlbert` stays light

AUTO_CONFIG_MODULE = "transformers.models.auto.configuration_auto"
CONFIG_MODULE = "vlbert.modeling.configuration_{}"  # ModelFamily.configuration_module
_models_registered: set[str] = set()  # the families on AutoModel and AutoModelForPreTraining


def _register_family_config(auto_config, family: registry.ModelFamily) -> None:
    # model_type is the key AutoConfig and a checkpoint's config.json share: one per family.
    config_class = registry.family_class(family, family.config_class)
    if config_class.model_type != family.name:
        raise ValueError(f"{config_class.__name__}.model_type is {config_class.model_type!r}, not {family.name!r}")
    auto_config.register(config_class.model_type, config_class, exist_ok=True)


def register_config(auto_config) -> bool:
    """Every family's config on AutoConfig (vlbert.registry.FAMILIES as it is now); False if left
    to a configuration module being imported (it imports transformers, which may load
    AutoConfig's module on the way): that module calls `register_on_use` at its end. A family
    whose classes live in a module of its own (ModelFamily.module) goes on here if that module is
    loaded, else with its models (`register_models`) when its first config is made."""
    families = [f for f in registry.FAMILIES.values() if f.module is None]
    for family in families:
        module = sys.modules.get(CONFIG_MODULE.format(family.name))
        if module is not None and not hasattr(module, family.config_class):
            return False
    # Those of their own module: only if it is loaded (whole), not imported in transformers' loading.
    families += [
        f
        for f in registry.FAMILIES.values()
        if f.module is not None and hasattr(sys.modules.get(f.module), f.config_class)
    ]
    for family in families:
        _register_family_config(auto_config, family)
    return True


def register_models() -> None:
    """Once per family: its encoder on AutoModel, its pre-training model on AutoModelForPreTraining
    (and its config on AutoConfig, for a family registered after transformers loaded it)."""
    families = [f for name, f in registry.FAMILIES.items() if name not in _models_registered]
    if not families:
        return
    _models_registered.update(f.name for f in families)
    from transformers import AutoConfig, AutoModel, AutoModelForPreTraining

    for family in families:
        config_class = registry.family_class(family, family.config_class)
        if family.module is not None:
            _register_family_config(AutoConfig, family)
        AutoModel.register(config_class, registry.family_class(family, family.model_class), exist_ok=True)
        pretraining = registry.family_class(family, family.pretraining_class)
        AutoModelForPreTraining.register(config_class, pretraining, exist_ok=True)


class _RegisterWhenLoaded(MetaPathFinder):
    """Finds nothing itself: transformers' modules load as the other finders find them, counted
    while they run; when none runs and AutoConfig's module is loaded, the configuration is
    registered and this finder leaves sys.meta_path."""

    def __init__(self):
        self.running = 0

    def find_spec(self, fullname, path, target=None):
        if fullname != "transformers" and not fullname.startswith("transformers."):
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None  # the import system finds it again, as it would have
        exec_module = spec.loader.exec_module

        def counted(module):
            self.running += 1
            try:
                exec_module(module)
            finally:
                self.running -= 1
            if self.running == 0:
                self.register_if_loaded()

        spec.loader.exec_module = counted
        return spec

    def register_if_loaded(self) -> None:
        loaded = sys.modules.get(AUTO_CONFIG_MODULE)
        registered = loaded is not None and hasattr(loaded, "AutoConfig") and register_config(loaded.AutoConfig)
        if registered and self in sys.meta_path:
            sys.meta_path.remove(self)


def register_on_use() -> None:
    """What `import vlbert` does (and VLBertConfig's module): see the module's docstring."""
    finder = next((f for f in sys.meta_path if isinstance(f, _RegisterWhenLoaded)), None)
    if finder is None:
        finder = _RegisterWhenLoaded()
        sys.meta_path.insert(0, finder)
    if finder.running == 0:
        finder.register_if_loaded()
