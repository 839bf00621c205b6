"""The official metrics of the fine-tuning tasks: VQA soft accuracy, VCR accuracy, RefCOCO+ IoU."""
