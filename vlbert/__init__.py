"""VL-BERT pre-training ablation study."""

__version__ = "0.1.0"

# The model classes on transformers' Auto classes: after `import vlbert`,
# AutoModel.from_pretrained(folder) loads a checkpoint the study wrote.
from .modeling import register_auto_classes as _register_auto_classes

_register_auto_classes()
