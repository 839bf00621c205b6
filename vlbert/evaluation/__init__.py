"""The official metrics of the fine-tuning tasks: VQA soft accuracy, VCR accuracy, RefCOCO+ IoU. Each
module names the official code it follows (repository and commit)."""
