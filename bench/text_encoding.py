"""Benchmark: encoding the fine-tuning tasks' text, with the processor's word-piece memo and without.

Every epoch of fine-tuning encodes the same words again (VCR: each question with each of its four
candidates). The processor memoises each word's pieces; this bench collates every task's training
examples as the task code does, for a few epochs, once with a fresh processor (its memo fills in
the first epoch) and once with the tokenizer called for every word, as before the memo, and
prints the seconds and their ratio (with memo / without). Needs the mini study's data, feature
stores and BERT init (`make reproduce`, or the workflow's stages up to bert_init).

    python bench/text_encoding.py [--config experiments/mini.yaml] [--epochs 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from vlbert import tasks
from vlbert.config import load_config
from vlbert.engine.build import load_processor
from vlbert.layout import Layout
from vlbert.modeling.processing_study import StudyProcessor


class TokenizerEveryWord(StudyProcessor):
    """The processor as it was before the memo: one tokenizer call per word, every time."""

    def _ids_of(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def collate_epochs(task, examples, epochs: int, batch_size: int) -> float:
    started = time.perf_counter()
    for _ in range(epochs):
        for start in range(0, len(examples), batch_size):
            task.collate(examples[start : start + batch_size])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/mini.yaml")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tasks", nargs="+", default=["vcr_q2a", "vcr_qa2r", "vqa", "refcoco_det"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    preset = load_config(args.config)
    layout = Layout(preset["name"])
    memo = load_processor(layout.bert, preset["model"].get("max_text_length", 64))
    print(f"{preset['name']} preset, training examples collated {args.epochs} times, one thread")
    print(f"{'task':12} {'examples':>8} {'memo (s)':>9} {'no memo (s)':>12} {'ratio':>6}")
    for name in args.tasks:
        seconds = []
        for processor in (memo, TokenizerEveryWord(memo.tokenizer, memo.max_text_length)):
            processor._word_ids.clear()
            task = tasks.build(name, processor, Path(preset["data"]["root"]), layout.features, "vlbert")
            examples = task.examples("train")
            seconds.append(collate_epochs(task, examples, args.epochs, 16))
        print(f"{name:12} {len(examples):8d} {seconds[0]:9.2f} {seconds[1]:12.2f} {seconds[0] / seconds[1]:6.2f}")


if __name__ == "__main__":
    main()
