"""Diagnosis: how much of VQA can a linear read of a frozen checkpoint give, and does fine-tuning get it?

For each setting, the VQA model as fine-tuning starts it (the setting's pre-trained checkpoint, or
for no_pretrain the BERT init and the detector) is frozen; its hidden state at the answer's
[MASK] is read for every training and test-dev question (eval mode, the setting's own stores).
  - linear probe: a logistic regression on those states (standardised; the fine-tuning loss on
    the soft scores, full batch, Adam), scored on test-dev: official accuracy, pair accuracy, per
    answer type, and with the images shuffled among the questions;
  - zero-shot: pre-training's MLM head at the same [MASK], restricted to the answers that are
    words of the vocabulary: does the masked-word read answer the question unprompted?
A fine-tuning run that ends at the question-only prior while its frozen start reads the answer
linearly is an optimisation failure, not a missing read.

    python bench/vqa_frozen_probe.py --results results/mini --config experiments/mini.yaml \
        [--settings no_pretrain a full] [--steps 1500]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from vlbert import tasks
from vlbert.config import load_config
from vlbert.engine.build import build_model, load_processor
from vlbert.modeling.modeling_vlbert import VLBertForPreTraining, vqa_loss
from vlbert.registry import setting as setting_entry
from vlbert.tasks.regions import feature_mean, with_other_images

TEXT_INPUTS = ("input_ids", "token_type_ids", "position_ids", "attention_mask", "visual_index")


def answer_states(model, task, examples, mlm=None, batch_size=64):
    """[N, H] the frozen hidden state at each question's answer [MASK]; with `mlm` (a pre-training
    model), [N, V] its MLM logits there too."""
    states, words = [], []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = task.collate(examples[start : start + batch_size])
            inputs = [batch[k] for k in TEXT_INPUTS]
            rows = torch.arange(len(batch["input_ids"])), batch["answer_positions"]
            states.append(model.vlbert(*inputs, batch["visual"])[rows])
            if mlm is not None:
                words.append(mlm.mlm(mlm.vlbert(*inputs, batch["visual"])[rows]))
    return torch.cat(states), (torch.cat(words) if words else None)


def soft_targets(task, examples) -> torch.Tensor:
    targets = torch.zeros(len(examples), len(task.answers))
    for k, e in enumerate(examples):
        for answer, score in e["scores"].items():
            targets[k, task.answer_index[answer]] = score
    return targets


def fit_linear_probe(states, targets, steps: int):
    mean, std = states.mean(0), states.std(0) + 1e-5
    weight = torch.zeros(states.shape[1], targets.shape[1], requires_grad=True)
    bias = torch.zeros(targets.shape[1], requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=1e-2)
    x = (states - mean) / std
    for _ in range(steps):
        optimizer.zero_grad()
        (vqa_loss(x @ weight + bias, targets) + 1e-4 * weight.square().sum()).backward()
        optimizer.step()
    return lambda s: ((s - mean) / std) @ weight.detach() + bias.detach()


def scored(task, examples, logits) -> dict:
    best = logits.argmax(1).tolist()
    predictions = [{"question_id": e["id"], "answer": task.answers[b]} for e, b in zip(examples, best)]
    return task.score(predictions, "test")


def summary(scores: dict) -> str:
    kinds = ", ".join(
        f"{k.removeprefix('accuracy_')} {v:.1f}" for k, v in sorted(scores.items()) if k.startswith("accuracy_")
    )
    return f"{scores['accuracy']:5.1f} (pairs {scores.get('pair_accuracy', float('nan')):4.1f}; {kinds})"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results/mini"))
    parser.add_argument("--config", type=Path, default=Path("experiments/mini.yaml"))
    parser.add_argument("--settings", nargs="+", default=["no_pretrain", "a", "full"])
    parser.add_argument("--steps", type=int, default=1500, help="full-batch Adam steps of the probe")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    preset, results = load_config(args.config), args.results
    processor = load_processor(results / "bert_init" / "bert", preset["model"]["max_text_length"])
    vocabulary = processor.tokenizer.get_vocab()
    for name in args.settings:
        setting = setting_entry(name)
        features = results / "features" / "tuned" / name if setting.tune_frcnn else results / "features"
        task = tasks.build("vqa", processor, results / "data", features, setting.family)
        train, test = task.examples("train"), task.examples("test")
        mlm = None
        if setting.pretrains:
            checkpoint = results / "pretrain" / name / "best"
            model = task.model_class.from_pretrained(checkpoint, **task.model_overrides(), tune_frcnn=False)
            mlm = VLBertForPreTraining.from_pretrained(checkpoint, tune_frcnn=False).eval()
        else:
            model, _ = build_model(
                task.model_class,
                preset,
                results / "bert_init" / "bert",
                results / "detector",
                **task.model_overrides(),
                appearance_mean=feature_mean(e["regions"] for e in train),
            )
        model.eval()
        train_states, _ = answer_states(model, task, train)
        test_states, test_words = answer_states(model, task, test, mlm)
        shuffled_states, _ = answer_states(model, task, with_other_images(test, 0))
        probe = fit_linear_probe(train_states, soft_targets(task, train), args.steps)
        print(f"{name:12s} linear probe {summary(scored(task, test, probe(test_states)))}")
        print(f"{'':12s} images shuffled {scored(task, test, probe(shuffled_states))['accuracy']:5.1f}")
        if test_words is not None:
            ids = [vocabulary.get(answer) for answer in task.answers]
            logits = torch.full((len(test), len(ids)), float("-inf"))
            known = [k for k, i in enumerate(ids) if i is not None]
            logits[:, known] = test_words[:, [ids[k] for k in known]]
            words = f"{len(known)} of {len(ids)} answers are words"
            print(f"{'':12s} zero-shot MLM {summary(scored(task, test, logits))} ({words})")


if __name__ == "__main__":
    main()
