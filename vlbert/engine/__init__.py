"""Training: BERT initialisation, pre-training, fine-tuning; loops, optimisers, checkpoints."""
