"""VL-BERT pre-training ablation study."""
__version__ = "0.1.0"
