"""The grounding probe: do the masked words that only the image can tell come from the image?

For each kind of word the captions' folder names (`word_kinds.json`: the synthetic world's
colours, shapes and sizes), every word of that kind in a val caption is masked at once and
predicted among the kind's words only, with the caption's own image and with another caption's
(paired as validation pairs them). Masking the whole kind leaves no other mention to copy ("a red
circle and a red square"), and choosing within the kind takes the grammar out of the guess: what
is left is which colour, shape or size, which only the image tells.
Own minus other is what the image adds, per kind.

The probe also measures where the masked words look, in a single-stream encoder (one attention over
words and visual elements; its `attention_columns` say which are which): the attention probability
mass they put on the visual elements, per layer, against the share that uniform attention would
give them.
"""

from __future__ import annotations

import re
from contextlib import contextmanager, nullcontext

import torch

from ..modeling.heads import IGNORE_INDEX
from .device import move_to
from .mlm_validation import other_image_order

MAX_EXAMPLES = 300


def kind_vocabulary(tokenizer, words) -> dict[str, int]:
    """The kind's words that the tokenizer keeps whole, with their token id: only a word that is
    one token can be masked by one [MASK] and told apart by one prediction."""
    vocabulary = {}
    for word in words:
        ids = tokenizer(word, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            vocabulary[word] = ids[0]
    return vocabulary


def mask_kind(text: str, words, vocabulary: dict[str, int], mask_token: str) -> tuple[str, list[int], int]:
    """The caption with every word of the kind that is one token replaced by the mask token; the
    masked words' token ids in order; and how many words of the kind were left (several tokens)."""
    labels, skipped = [], 0

    def replace(match):
        nonlocal skipped
        word = match.group(0).lower()  # the world's words are lower case, as are its captions
        if word not in vocabulary:
            skipped += 1
            return match.group(0)
        labels.append(vocabulary[word])
        return mask_token

    pattern = r"\b(" + "|".join(sorted(map(re.escape, words), key=len, reverse=True)) + r")\b"
    return re.sub(pattern, replace, text, flags=re.IGNORECASE), labels, skipped


def probe_batch(collate, examples: list[dict], labels: list[list[int]], mask_id: int) -> dict:
    """Collate as validation does (the visual inputs, images for a tuned Fast R-CNN included, are
    built the same way), undo the collator's random masking, and label exactly the probe's masks."""
    batch = collate(examples, torch.Generator().manual_seed(0))
    ids = torch.where(batch["mlm_labels"] != IGNORE_INDEX, batch["mlm_labels"], batch["input_ids"])
    targets = torch.full_like(ids, IGNORE_INDEX)
    for k, words in enumerate(labels):
        positions = (ids[k] == mask_id).nonzero().flatten()
        # Truncation may have cut the caption's last masked words.
        targets[k, positions] = torch.tensor(words[: len(positions)], dtype=ids.dtype)
    batch["input_ids"], batch["mlm_labels"] = ids, targets
    return batch


def attention_share(
    attentions, visual_keys: torch.Tensor, queries: torch.Tensor, attended: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each query (a masked word): the attention mass it puts on the visual keys in every
    layer (mean over heads), [queries, layers]; and the mass uniform attention over the keys it
    attends would put there (the visual keys' share of them), [queries]. Masks are [B, L] over the
    encoder's sequence."""
    visual = visual_keys.float()
    shares = torch.stack([torch.einsum("bqk,bk->bq", a.float().mean(1), visual)[queries] for a in attentions], -1)
    uniform = visual.sum(1) / attended.float().sum(1)
    return shares, uniform.unsqueeze(1).expand_as(queries)[queries]


@contextmanager
def recorded_attentions(bert):
    """Each layer's attention probabilities [B, heads, L, L] of the forwards run in the block.
    Under SDPA the encoder never forms them, so the block runs eager attention (the same maths),
    then restores the model's own."""
    previous = bert.config._attn_implementation
    recorded = []
    hooks = [
        layer.attention.self.register_forward_hook(lambda module, args, output: recorded.append(output[1]))
        for layer in bert.encoder.layer
    ]
    bert.set_attn_implementation("eager")
    try:
        yield recorded
    finally:
        bert.set_attn_implementation(previous)
        for hook in hooks:
            hook.remove()


@contextmanager
def recorded_outputs(module):
    """The outputs of `module`'s forwards run in the block."""
    recorded = []
    hook = module.register_forward_hook(lambda module, args, output: recorded.append(output))
    try:
        yield recorded
    finally:
        hook.remove()


def probe_batches(
    processor, collate, examples: list[dict], words, batch_size: int = 32, max_examples: int = MAX_EXAMPLES
):
    """For one word kind, per batch of the first `max_examples` captions: the batch with each
    caption's own image, the same captions and masks with the image validation pairs it with (one
    with as many regions, so that both encode alike), and the number of words skipped."""
    vocabulary = kind_vocabulary(processor.tokenizer, words)
    order = other_image_order([e["regions"].num_rois for e in examples])
    end = min(len(examples), max_examples)
    for start in range(0, end, batch_size):
        chunk = range(start, min(start + batch_size, end))
        masked = [mask_kind(examples[i]["text"], words, vocabulary, processor.tokenizer.mask_token) for i in chunk]
        labels = [labels for _, labels, _ in masked]
        own = [{**examples[i], "text": text} for i, (text, _, _) in zip(chunk, masked)]
        other = [{**e, "regions": examples[order[i]]["regions"]} for i, e in zip(chunk, own)]
        yield (
            probe_batch(collate, own, labels, processor.mask_id),
            probe_batch(collate, other, labels, processor.mask_id),
            sum(skipped for _, _, skipped in masked),
        )


@torch.inference_mode()
def grounding_probe(
    model,
    processor,
    collate,
    examples: list[dict],
    word_kinds: dict[str, tuple[str, ...]],
    batch_size: int = 32,
    max_examples: int = MAX_EXAMPLES,
) -> dict:
    """Per word kind of `word_kinds` ({kind: words}, `read_word_kinds`): accuracy (%) among the
    kind's words with the own image and another's, their gain, chance (%), the number of masked
    words and of words skipped (several tokens); and the attention share of the masked words on
    the visual elements per layer (own image; single-stream families), with its uniform baseline.
    `examples` are the val captions ("text", "regions"), in validation's order."""
    model.eval()
    device = next(model.parameters()).device
    metrics, shares, uniform = {}, [], []
    # A two-stream encoder's words reach the visual elements through co-attention: no share to read.
    base = model.base_model
    single_stream = base.single_stream
    recording = recorded_attentions(base.bert) if single_stream else nullcontext([])
    encoding = recorded_outputs(base) if single_stream else nullcontext([])
    with recording as attentions, encoding as encoded:
        for kind, words in word_kinds.items():
            candidates = torch.tensor(sorted(set(kind_vocabulary(processor.tokenizer, words).values())), device=device)
            if not len(candidates):
                continue
            right, count, skipped = {"own": 0, "other": 0}, 0, 0
            for own, other, skipped_here in probe_batches(
                processor, collate, examples, words, batch_size, max_examples
            ):
                skipped += skipped_here
                if not (own["mlm_labels"] != IGNORE_INDEX).any():
                    continue
                for image, batch in (("own", own), ("other", other)):
                    batch = move_to(batch, device)
                    attentions.clear()
                    encoded.clear()
                    out = model(**batch)
                    targets = batch["mlm_labels"][batch["mlm_labels"] != IGNORE_INDEX]
                    right[image] += int((candidates[out.mlm_logits[:, candidates].argmax(-1)] == targets).sum())
                    if image == "own":
                        count += len(targets)
                    if image == "own" and single_stream:
                        share, baseline = attention_share(attentions, *base.attention_columns(batch, encoded[0]))
                        shares.append(share.cpu())
                        uniform.append(baseline.cpu())
            own_accuracy, other_accuracy = (100 * right[i] / max(count, 1) for i in ("own", "other"))
            metrics.update(
                {
                    f"ground_{kind}_own": own_accuracy,
                    f"ground_{kind}_other": other_accuracy,
                    f"ground_{kind}_gain": own_accuracy - other_accuracy,
                    f"ground_{kind}_chance": 100 / len(candidates),
                    f"ground_{kind}_n": count,
                    f"ground_{kind}_skipped": skipped,
                }
            )
    if shares:
        per_layer = torch.cat(shares).mean(0)
        metrics.update({f"attention_img_share_layer{i}": float(v) for i, v in enumerate(per_layer)})
        metrics["attention_img_share"] = float(per_layer.mean())
        metrics["attention_img_uniform"] = float(torch.cat(uniform).mean())
    return metrics
