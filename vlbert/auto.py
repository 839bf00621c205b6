"""The model families on transformers' Auto classes, without importing transformers at `import vlbert`.

After `import vlbert`, AutoConfig and AutoModel / AutoModelForPreTraining .from_pretrained(folder)
load a checkpoint the study wrote. Registering there and then would import transformers' Auto
classes, and torch with them (seconds for `vlbert --help`), so `import vlbert` only arranges it:

- model_types "vlbert", "vilbert" and "pixelbert" go on AutoConfig once transformers has loaded
  AutoConfig's module (at once if it has already). Not while transformers is still loading it: transformers loads it on
  the way to AutoModel, and a configuration class cannot be made before AutoModel's module is
  whole (BertConfig's docstring asks it). So a finder on sys.meta_path lets transformers' modules
  load as they would, counts those running, and registers when none is.
- the models go on AutoModel and AutoModelForPreTraining when the first config is made
  (from_pretrained makes the config before it looks for the model class): they import
  transformers' BERT, which must not be in the middle of its own loading either.
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder

from . import registry  # plain dataclasses: `import vlbert` stays light

AUTO_CONFIG_MODULE = "transformers.models.auto.configuration_auto"
# Per model family (vlbert.registry.FAMILIES): its config class, its modeling module and the
# classes that go on AutoModel and AutoModelForPreTraining.
FAMILIES = {
    name: (f.config_class, f.modeling_module, f.model_class, f.pretraining_class)
    for name, f in registry.FAMILIES.items()
}
CONFIG_MODULE = "vlbert.modeling.configuration_{}"  # ModelFamily.configuration_module
_models_registered = False


def register_config(auto_config) -> bool:
    """Every family's config on AutoConfig; False if left to a configuration module being
    imported (it imports transformers, which may load AutoConfig's module on the way): that
    module calls `register_on_use` at its end."""
    import importlib

    for family, (config_name, *_) in FAMILIES.items():
        module = sys.modules.get(CONFIG_MODULE.format(family))
        if module is not None and not hasattr(module, config_name):
            return False
    for family, (config_name, *_) in FAMILIES.items():
        config_class = getattr(importlib.import_module(CONFIG_MODULE.format(family)), config_name)
        auto_config.register(config_class.model_type, config_class, exist_ok=True)
    return True


def register_models() -> None:
    """Once: each family's encoder on AutoModel, its pre-training model on AutoModelForPreTraining."""
    global _models_registered
    if _models_registered:
        return
    _models_registered = True
    import importlib

    from transformers import AutoModel, AutoModelForPreTraining

    for family, (config_name, modeling, encoder, pretraining) in FAMILIES.items():
        config_class = getattr(importlib.import_module(CONFIG_MODULE.format(family)), config_name)
        module = importlib.import_module(f"vlbert.modeling.{modeling}")
        AutoModel.register(config_class, getattr(module, encoder), exist_ok=True)
        AutoModelForPreTraining.register(config_class, getattr(module, pretraining), exist_ok=True)


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
