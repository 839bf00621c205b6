"""Diagnosis: does Pixel-BERT keep colour in its pixel tokens, and do masked colour words read it?

For each pre-training checkpoint given (and the untrained model: the detector's CNN and a fresh
pixel embedding), on the captions that name exactly one colour:
  - colour probe: a linear classifier of the caption's colour, trained on the train images'
    features and scored on val, over the C5 map's mean and over the pixel tokens' mean (chance
    1 / 7): is the colour still there after pre-training? Beside it, colour's share of those
    features' variance (between the colours over the total): how strong a component it is
    for attention and the MLM head to pick up, which a probe on standardised features hides;
    with --features, the same for the detector's region features (the top-scoring region of
    each image: what VL-BERT's [IMG] elements take), for comparison.
  - dead units: the share of the pixel embedding's ReLU outputs that are zero, and of hidden
    dimensions zero on every token of the probe's training images;
  - masked colour words (every colour word of a val caption masked, scored among the colours)
    right with the caption's own image and with the next caption's; their attention mass on the
    pixel tokens per layer, against the share the pixel tokens would get under uniform attention.
The pre-training metrics' `ground_colour_own` / `_other` measure the same reading on their own
sample; this prints why it does or does not happen.

    python bench/pixel_grounding.py results/mini/pretrain/pixelbert_no_sampling/best \
        [results/mini/pretrain/pixelbert/best ...] [--data results/mini/data] [--detector results/mini/detector]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerFast

from vlbert.data.conceptual_captions import read_captions
from vlbert.data.images import load_image
from vlbert.data.synthetic.world import COLOURS
from vlbert.engine.grounding import kind_vocabulary, mask_kind, recorded_attentions
from vlbert.modeling import PixelBertConfig, PixelBertForPreTraining
from vlbert.modeling.configuration_study import SEGMENT_IMAGE

COLOUR_NAMES = list(COLOURS)  # the world's colour words
COLOUR_WORD = re.compile(rf"\b({'|'.join(COLOUR_NAMES)})\b")


def one_colour_captions(data: Path, split: str, limit: int) -> list[tuple[str, Path, int]]:
    """(caption, image path, colour index) of the captions that name exactly one colour."""
    found = []
    for record in read_captions(data / "conceptual_captions" / f"{split}.tsv"):
        colours = set(COLOUR_WORD.findall(record.caption))
        if len(colours) == 1:
            found.append((record.caption, record.image_path, COLOUR_NAMES.index(colours.pop())))
        if len(found) >= limit:
            break
    return found


@torch.no_grad()
def pooled_features(model: PixelBertForPreTraining, items) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per image, [N, C] the C5 map's mean over cells and [N, H] the pixel tokens' mean; and
    [N * cells, H] the pixel embedding's ReLU outputs (the tokens less the shared embedding)."""
    base, c5s, tokens, activations = model.pixelbert, [], [], []
    for start in range(0, len(items), 32):
        features, _ = base.cnn([load_image(path) for _, path, _ in items[start : start + 32]])
        pixel_tokens, _ = base.pixel_embeddings(features)
        c5s.append(features.flatten(2).mean(2))
        tokens.append(pixel_tokens.mean(1))
        activations.append((pixel_tokens - base.pixel_embeddings.visual_embedding).flatten(0, 1))
    return torch.cat(c5s), torch.cat(tokens), torch.cat(activations)


def linear_probe(train_x, train_y, val_x, val_y, steps: int = 300) -> float:
    """Accuracy (%) on val of a softmax classifier trained full-batch on standardised features."""
    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    train_x, val_x = (train_x - mean) / std, (val_x - mean) / std
    torch.manual_seed(0)
    classifier = torch.nn.Linear(train_x.shape[1], len(COLOUR_NAMES))
    optimizer = torch.optim.Adam(classifier.parameters(), lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(classifier(train_x), train_y).backward()
        optimizer.step()
    with torch.no_grad():
        return 100.0 * (classifier(val_x).argmax(1) == val_y).float().mean().item()


def colour_share(features: torch.Tensor, colours: torch.Tensor) -> float:
    """The share (%) of the features' variance that lies between the colours' means."""
    mean = features.mean(0)
    total = (features - mean).square().sum()
    between = sum(
        (colours == c).sum() * (features[colours == c].mean(0) - mean).square().sum() for c in colours.unique()
    )
    return 100.0 * float(between / total)


def top_region_features(features_dir: Path, data: Path, split: str, items) -> torch.Tensor:
    """[N, D] each item's image's top-scoring region's appearance feature from the study's store."""
    from vlbert.registry import PRETRAINING_STORES
    from vlbert.tasks.regions import open_store, regions_of

    store, root = open_store(features_dir, PRETRAINING_STORES[split]), data / "conceptual_captions"
    rows = []
    for _, path, _ in items:
        regions = regions_of(store, str(path.relative_to(root)))
        best = 1 + int(regions.probs[1:, 1:].max(1).argmax())  # row 0 is the whole image
        rows.append(torch.from_numpy(regions.features[best].astype("float32")))
    return torch.stack(rows)


def dead_units(activations: torch.Tensor) -> tuple[float, float]:
    """(% of ReLU outputs zero, % of hidden dimensions zero on every token)."""
    zero = activations == 0
    return 100.0 * zero.float().mean().item(), 100.0 * zero.all(0).float().mean().item()


@torch.no_grad()
def masked_colour_reading(model, tokenizer, items) -> tuple[dict, list[float], float]:
    """Masked colour words right (%) with the own and another image; their mean attention mass on
    the pixel tokens per layer; the pixel tokens' mean share of the sequence (uniform attention).
    One caption at a time, as PixelBertModel.forward lays it out: words, then every pixel token
    at position 0 in the image segment."""
    base = model.pixelbert
    # The study's probe (vlbert.engine.grounding): every colour word masked, chosen among the colours.
    vocabulary = kind_vocabulary(tokenizer, COLOUR_NAMES)
    candidates = torch.tensor(sorted(vocabulary.values()))
    right, words, mass, uniform = {"own": 0, "other": 0}, 0, None, 0.0
    with recorded_attentions(base.bert) as attentions:
        for k, (caption, image_path, _) in enumerate(items):
            text, labels, _ = mask_kind(caption, COLOUR_NAMES, vocabulary, tokenizer.mask_token)
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            masked, gold = ids[0] == tokenizer.mask_token_id, torch.tensor(labels)
            words += len(gold)
            length = ids.shape[1]
            for which, path in (("own", image_path), ("other", items[(k + 1) % len(items)][1])):
                pixels = base.pixel_tokens([load_image(path)])
                count = pixels.tokens.shape[1]
                attentions.clear()
                out = base.bert(
                    inputs_embeds=torch.cat([base.bert.embeddings.word_embeddings(ids), pixels.tokens], 1),
                    token_type_ids=torch.cat([torch.zeros_like(ids), torch.full((1, count), SEGMENT_IMAGE)], 1),
                    position_ids=torch.cat([torch.arange(length)[None], torch.zeros(1, count, dtype=torch.long)], 1),
                )
                logits = model.mlm(out.last_hidden_state[0, :length][masked])[:, candidates]
                right[which] += int((candidates[logits.argmax(1)] == gold).sum())
                if which == "own":
                    share = torch.stack([a[0, :, :length][:, masked][..., length:].sum(-1).mean() for a in attentions])
                    mass = share if mass is None else mass + share
                    uniform += count / (count + length)
    return {w: 100.0 * r / words for w, r in right.items()}, (mass / len(items)).tolist(), uniform / len(items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pretrained", nargs="+", type=Path, help="Pixel-BERT pre-training checkpoints (best/)")
    parser.add_argument("--data", type=Path, default=Path("results/mini/data"))
    parser.add_argument("--detector", type=Path, default=Path("results/mini/detector"))
    parser.add_argument("--features", type=Path, help="the study's feature stores, for the region comparison")
    parser.add_argument("--train", type=int, default=1500, help="probe training images")
    parser.add_argument("--val", type=int, default=200, help="val captions")
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, val = one_colour_captions(args.data, "train", args.train), one_colour_captions(args.data, "val", args.val)
    train_y, val_y = torch.tensor([c for *_, c in train]), torch.tensor([c for *_, c in val])
    print(f"one-colour captions: {len(train)} train, {len(val)} val; chance {100 / len(COLOUR_NAMES):.1f}%")
    if args.features is not None:
        regions_train = top_region_features(args.features, args.data, "train", train)
        regions_val = top_region_features(args.features, args.data, "val", val)
        print(
            f"detector's top region: colour probe {linear_probe(regions_train, train_y, regions_val, val_y):.1f}%, "
            f"colour's share of its variance {colour_share(regions_train, train_y):.1f}%"
        )
    torch.manual_seed(0)  # the untrained pixel embedding's draw
    untrained = PixelBertForPreTraining(PixelBertConfig.from_pretrained(args.pretrained[0])).eval()
    untrained.load_detector(args.detector)
    models = [("untrained", untrained)]
    models += [(str(path), PixelBertForPreTraining.from_pretrained(path).eval()) for path in args.pretrained]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.pretrained[0])
    for name, model in models:
        (c5_train, tokens_train, activations), (c5_val, tokens_val, _) = (
            pooled_features(model, train),
            pooled_features(model, val),
        )
        zero, dead = dead_units(activations)
        print(f"{name}")
        print(
            f"  colour probe: C5 map {linear_probe(c5_train, train_y, c5_val, val_y):.1f}%, "
            f"pixel tokens {linear_probe(tokens_train, train_y, tokens_val, val_y):.1f}%; "
            f"colour's share of their variance {colour_share(c5_train, train_y):.1f}%, "
            f"{colour_share(tokens_train, train_y):.1f}%; "
            f"ReLU outputs zero {zero:.1f}%, hidden dims dead {dead:.1f}%"
        )
        if model is untrained:
            continue
        right, mass, uniform = masked_colour_reading(model, tokenizer, val)
        print(
            f"  masked colour words right: own image {right['own']:.1f}%, other {right['other']:.1f}%; "
            f"attention on pixel tokens per layer {', '.join(f'{m:.2f}' for m in mass)} (uniform {uniform:.2f})"
        )


if __name__ == "__main__":
    main()
