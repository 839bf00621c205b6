"""VL-BERT pre-training ablation study."""

__version__ = "0.1.0"

# The model classes on transformers' Auto classes: after `import vlbert`,
# AutoModel.from_pretrained(folder) loads a checkpoint the study wrote. Done when transformers'
# Auto classes load, not here: vlbert/auto.py.
from .auto import register_on_use as _register_on_use

_register_on_use()
