"""VL-BERT pre-training ablation study.

`import vlbert.modeling` puts the model families on transformers' Auto classes; `import vlbert`
alone stays light (no torch, no transformers).
"""

__version__ = "0.1.0"
