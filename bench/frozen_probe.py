"""Diagnosis: what can a read of a frozen checkpoint give a task, and does fine-tuning get it?

For each setting, the task model as fine-tuning starts it (the setting's pre-trained checkpoint,
or for no_pretrain the BERT init and the detector) is frozen, in eval mode, on the setting's own
stores; the state the task's head reads is taken for every training and reported-split item:
  - vqa: the answer's [MASK]. A linear probe (logistic regression on the standardised states, the
    fine-tuning loss on the soft scores, full batch, Adam) scored on test-dev: official accuracy,
    pair accuracy, per answer type, and with the images shuffled among the questions; and
    pre-training's MLM head at the same [MASK], restricted to the answers that are words: does the
    masked-word read answer unprompted?
  - vcr_q2a, vcr_qa2r: each candidate's [CLS]. The study's VCR head (its classifier, the candidates
    centred as the preset's `centre_candidates` says; softmax over the four) trained alone on the frozen states,
    batch 16, for the preset's run epochs and for --epochs, on the states as they are and
    standardised by the training set's per-dimension mean and deviation; test accuracy, and with
    the images shuffled for the standardised one. Also: whether the state at a question's tag word
    reads its object's colour and shape (the right rationale names them), a linear probe; the tag
    takes its object at the scale fine-tuning gives it (the preset's `tags_at_region_scale`).
A fine-tuning run that ends at its blind floor while its frozen start is read this way has failed
to optimise, not to see.

    python bench/frozen_probe.py --results results/mini --config experiments/mini.yaml \
        [--task vqa] [--settings no_pretrain a full]
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from vlbert import tasks
from vlbert.config import finetune_epochs, finetune_options, load_config
from vlbert.data.synthetic.world import COLOURS as WORLD_COLOURS
from vlbert.data.synthetic.world import SHAPES
from vlbert.engine.build import build_model, load_processor
from vlbert.modeling.configuration_study import SEGMENT_IMAGE
from vlbert.modeling.heads import candidate_logits, task_classifier, vqa_loss
from vlbert.modeling.modeling_vlbert import VLBertForPreTraining
from vlbert.registry import setting as setting_entry
from vlbert.tasks.regions import feature_mean, with_other_images

TEXT_INPUTS = ("input_ids", "token_type_ids", "position_ids", "attention_mask", "visual_index")
COLOURS = tuple(WORLD_COLOURS)


def hidden_states(model, batch) -> torch.Tensor:
    return model.vlbert(*[batch[k] for k in TEXT_INPUTS], batch["visual"])


def standardiser(states: torch.Tensor):
    """Per-dimension mean and deviation of [N, ..., H] states, as a function."""
    flat = states.reshape(-1, states.shape[-1])
    mean, std = flat.mean(0), flat.std(0) + 1e-5
    return lambda s: (s - mean) / std


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return 100 * float((logits.argmax(-1) == labels).float().mean())


# ---- VQA -----------------------------------------------------------------------------------------


def vqa_states(model, task, examples, mlm=None, batch_size=64):
    """[N, H] the frozen state at each question's answer [MASK]; with `mlm` (a pre-training
    model), [N, V] its MLM logits there too."""
    states, words = [], []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = task.collate(examples[start : start + batch_size])
            rows = torch.arange(len(batch["input_ids"])), batch["answer_positions"]
            states.append(hidden_states(model, batch)[rows])
            if mlm is not None:
                words.append(mlm.mlm(hidden_states(mlm, batch)[rows]))
    return torch.cat(states), (torch.cat(words) if words else None)


def soft_targets(task, examples) -> torch.Tensor:
    targets = torch.zeros(len(examples), len(task.answers))
    for k, e in enumerate(examples):
        for answer, score in e["scores"].items():
            targets[k, task.answer_index[answer]] = score
    return targets


def fit_linear_probe(states, targets, loss, outputs: int, steps: int, l2: float = 0.0):
    """A linear map of the standardised states, fitted with `loss(logits, targets)` (full batch,
    Adam); returns the fitted logits as a function of states."""
    standard = standardiser(states)
    weight = torch.zeros(states.shape[-1], outputs, requires_grad=True)
    bias = torch.zeros(outputs, requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=1e-2)
    x = standard(states)
    for _ in range(steps):
        optimizer.zero_grad()
        (loss(x @ weight + bias, targets) + l2 * weight.square().sum()).backward()
        optimizer.step()
    return lambda s: standard(s) @ weight.detach() + bias.detach()


def vqa_scores(task, examples, logits) -> dict:
    best = logits.argmax(1).tolist()
    return task.score([{"question_id": e["id"], "answer": task.answers[b]} for e, b in zip(examples, best)], "test")


def vqa_summary(scores: dict) -> str:
    kinds = ", ".join(
        f"{k.removeprefix('accuracy_')} {v:.1f}" for k, v in sorted(scores.items()) if k.startswith("accuracy_")
    )
    return f"{scores['accuracy']:5.1f} (pairs {scores.get('pair_accuracy', float('nan')):4.1f}; {kinds})"


def probe_vqa(name, model, mlm, task, vocabulary, args, preset):
    train, test = task.examples("train"), task.examples("test")
    train_states, _ = vqa_states(model, task, train)
    test_states, test_words = vqa_states(model, task, test, mlm)
    shuffled_states, _ = vqa_states(model, task, with_other_images(test, 0))
    targets = soft_targets(task, train)
    probe = fit_linear_probe(train_states, targets, vqa_loss, targets.shape[1], args.steps, l2=1e-4)
    print(f"{name:12s} linear probe {vqa_summary(vqa_scores(task, test, probe(test_states)))}")
    print(f"{'':12s} images shuffled {vqa_scores(task, test, probe(shuffled_states))['accuracy']:5.1f}")
    if test_words is not None:
        ids = [vocabulary.get(answer) for answer in task.answers]
        logits = torch.full((len(test), len(ids)), float("-inf"))
        known = [k for k, i in enumerate(ids) if i is not None]
        logits[:, known] = test_words[:, [ids[k] for k in known]]
        words = f"{len(known)} of {len(ids)} answers are words"
        print(f"{'':12s} zero-shot MLM {vqa_summary(vqa_scores(task, test, logits))} ({words})")


# ---- VCR -----------------------------------------------------------------------------------------


def tagged_objects(path: Path) -> list[dict[int, tuple[int, int]]]:
    """Per question of a VCR file, object index -> (colour, shape) as its right rationale names
    them ("[i] is <size> <colour> <shape>")."""
    found = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        words = record["rationale_choices"][record["rationale_label"]]
        objects = {}
        for k in range(len(words) - 4):
            tag, verb, _, colour, shape = words[k : k + 5]
            if isinstance(tag, list) and verb == "is" and colour in COLOURS and shape in SHAPES:
                objects[tag[0]] = (COLOURS.index(colour), SHAPES.index(shape))
        found.append(objects)
    return found


def vcr_states(model, task, examples, objects=None, batch_size=16):
    """[N, 4, H] each candidate's frozen [CLS] state; with `objects` (tagged_objects), also the
    state at the first piece of each named object's tag word in the first candidate's sequence,
    [M, H], and its (colour, shape) labels, [M, 2]."""
    cls, tags, labels = [], [], []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            batch = task.collate(chunk)
            hidden = hidden_states(model, batch)
            cls.append(hidden[:, 0].reshape(len(chunk), -1, hidden.shape[-1]))
            if objects is None:
                continue
            rows = batch["visual_index"].reshape(len(chunk), -1, batch["visual_index"].shape[-1])[:, 0]
            text = (batch["token_type_ids"].reshape(len(chunk), -1, rows.shape[-1])[:, 0] != SEGMENT_IMAGE) & (
                rows > 0
            )
            for k, named in enumerate(objects[start : start + batch_size]):
                for index, label in named.items():
                    where = (text[k] & (rows[k] == index + 1)).nonzero()
                    if len(where):
                        tags.append(hidden[4 * k, where[0, 0]])
                        labels.append(label)
    tag_states = (torch.stack(tags), torch.tensor(labels)) if tags else None
    return torch.cat(cls), tag_states


def train_head_alone(config, states, labels, epochs, centre: bool, lr=3e-3, seed=0):
    """The study's VCR head (`task_classifier`, scored through `candidate_logits`) trained alone on
    frozen [N, 4, H] states, batch 16. `centre`: the preset's `centre_candidates`."""
    torch.manual_seed(seed)
    head_config = copy.copy(config)
    head_config.standardise_head_input = False  # the probe standardises (or not) its states itself
    head = task_classifier(head_config, 1)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=1e-4)

    def scores(batch_states):
        return candidate_logits(head, batch_states.flatten(0, 1), batch_states.shape[1], centre)

    for _ in range(epochs):
        order = torch.randperm(len(states))
        for start in range(0, len(states), 16):
            batch = order[start : start + 16]
            optimizer.zero_grad()
            F.cross_entropy(scores(states[batch]), labels[batch]).backward()
            optimizer.step()
    head.eval()
    return lambda s: scores(s).detach()


def probe_vcr(name, model, mlm, task, vocabulary, args, preset):
    (train_file,), (test_file,) = task.spec.splits["train"], task.spec.splits["test"]
    vcr = Path(task.data_root) / "vcr"
    train, test = task.examples("train"), task.examples("test")
    train_labels = torch.tensor([e["label"] for e in train])
    test_labels = torch.tensor([e["label"] for e in test])
    train_cls, train_tags = vcr_states(model, task, train, tagged_objects(vcr / f"{train_file}.jsonl"))
    test_cls, test_tags = vcr_states(model, task, test, tagged_objects(vcr / f"{test_file}.jsonl"))
    shuffled_cls, _ = vcr_states(model, task, with_other_images(test, 0))
    standard = standardiser(train_cls)
    centre = bool(preset["finetune"]["vcr"].get("centre_candidates"))
    for epochs in sorted({finetune_epochs(preset, task.name), args.epochs}):
        raw = train_head_alone(model.config, train_cls, train_labels, epochs, centre)
        scaled = train_head_alone(model.config, standard(train_cls), train_labels, epochs, centre)
        as_they_are = accuracy(raw(test_cls), test_labels)
        standardised = accuracy(scaled(standard(test_cls)), test_labels)
        shuffled = accuracy(scaled(standard(shuffled_cls)), test_labels)
        print(
            f"{name:12s} head alone, {epochs:2d} epochs: states as they are {as_they_are:5.1f}, "
            f"standardised {standardised:5.1f} (images shuffled {shuffled:5.1f})"
        )
    if train_tags and test_tags:
        (train_states, train_objects), (test_states, test_objects) = train_tags, test_tags
        reads = [
            accuracy(
                fit_linear_probe(train_states, train_objects[:, k], F.cross_entropy, n, 1000)(test_states),
                test_objects[:, k],
            )
            for k, n in ((0, len(COLOURS)), (1, len(SHAPES)))
        ]
        counted = f"n {len(test_objects)}"
        print(f"{'':12s} tag word reads its object: colour {reads[0]:5.1f}, shape {reads[1]:5.1f} ({counted})")


PROBES = {"vqa": probe_vqa, "vcr_q2a": probe_vcr, "vcr_qa2r": probe_vcr}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results/mini"))
    parser.add_argument("--config", type=Path, default=Path("experiments/mini.yaml"))
    parser.add_argument("--task", choices=sorted(PROBES), default="vqa")
    parser.add_argument("--settings", nargs="+", default=["no_pretrain", "a", "full"])
    parser.add_argument("--steps", type=int, default=1500, help="VQA: full-batch Adam steps of the probe")
    parser.add_argument("--epochs", type=int, default=10, help="VCR: epochs of the head alone besides the preset's")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    preset, results = load_config(args.config), args.results
    processor = load_processor(results / "bert_init" / "bert", preset["model"]["max_text_length"])
    vocabulary = processor.tokenizer.get_vocab()
    # The tags read their objects as fine-tuning reads them (the preset's tags_at_region_scale).
    overrides = {"tags_at_region_scale": bool(finetune_options(preset, args.task).get("tags_at_region_scale"))}
    for name in args.settings:
        setting = setting_entry(name)
        features = results / "features" / "tuned" / name if setting.tune_frcnn else results / "features"
        task = tasks.build(args.task, processor, results / "data", features, setting.family)
        mlm = None
        if setting.pretrains:
            checkpoint = results / "pretrain" / name / "best"
            model = task.model_class.from_pretrained(
                checkpoint, **task.model_overrides(), **overrides, tune_frcnn=False
            )
            if args.task == "vqa":
                mlm = VLBertForPreTraining.from_pretrained(checkpoint, tune_frcnn=False).eval()
        else:
            model, _ = build_model(
                task.model_class,
                preset,
                results / "bert_init" / "bert",
                results / "detector",
                **task.model_overrides(),
                **overrides,
                appearance_mean=feature_mean(e["regions"] for e in task.examples("train")),
                image_paths=(e["regions"].image_path for e in task.examples("train")),
            )
        model.eval()
        PROBES[args.task](name, model, mlm, task, vocabulary, args, preset)


if __name__ == "__main__":
    main()
