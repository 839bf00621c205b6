"""The embedded default's stand-in for BERT's own pre-training: text-only masked language
modelling of a small BERT (transformers' BertForMaskedLM) on the synthetic text corpus. Its
vocabulary is BERT's uncased WordPiece, or, with `model.wordpiece_vocab_size`, a WordPiece
vocabulary of the world's language (corpus, captions, the tasks' training text), as BERT's was
made from the text it covers.
The paper preset names a real BERT checkpoint instead.

`BertInitStage` is the stage (stage.py); `bert_init` runs it."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM

from ..data.conceptual_captions import read_captions
from ..data.text_corpus import read_corpus
from ..modeling.processing_study import StudyProcessor, wordpiece_from_texts
from ..tasks.pretraining import CorpusDataset, TextOnlyCollator
from .checkpoint import input_identity
from .optim import build_optimizer, build_scheduler
from .seeding import batch_generator, epoch_order
from .stage import Stage, run_stage


def world_text_files(data_root) -> list[Path]:
    """The files `world_texts` reads."""
    root = Path(data_root)
    return [
        root / "text_corpus" / "corpus.txt",
        root / "conceptual_captions" / "train.tsv",
        root / "vqa" / "v2_OpenEnded_mscoco_train2014_questions.json",
        root / "vcr" / "train.jsonl",
        root / "refcoco+" / "refs(unc).p",
        root / "refcoco+" / "instances.json",
    ]


def world_texts(data_root) -> list[str]:
    """The world's language: the text corpus, and the training splits' captions, questions,
    answers, rationales and referring expressions (no val or test text, no labels)."""
    from ..data.refcoco import RefCOCO
    from ..data.vcr import read_vcr, vcr_text
    from ..data.vqa import read_vqa

    corpus, captions, questions, vcr, refs, _ = world_text_files(data_root)
    texts = read_corpus(corpus)
    texts += [c.caption for c in read_captions(captions)]
    texts += [q.question for q in read_vqa(questions)]
    for item in read_vcr(vcr):
        texts += [vcr_text(t, item.objects) for t in (item.question, *item.answer_choices, *item.rationale_choices)]
    texts += [e.sentence for e in RefCOCO(refs.parent).expressions("train")]
    return texts


def world_processor(preset: dict, data_root, processor: StudyProcessor) -> StudyProcessor:
    """`processor`, or one with a WordPiece vocabulary of the world's language (`world_texts`)
    when the preset sets `model.wordpiece_vocab_size`."""
    size = preset["model"].get("wordpiece_vocab_size")
    if not size:
        return processor
    return StudyProcessor(wordpiece_from_texts(world_texts(data_root), size), processor.max_text_length)


def init_word_embeddings(model: BertForMaskedLM, std: float) -> None:
    """Draw the word embeddings (and so the tied MLM decoder) from N(0, std), padding row zero.

    A few hundred steps on a corpus that uses the words of a kind alike (the colours, the shapes)
    pull their embeddings into one: from BERT's 0.02 their spread ends at 0.4 of the part they
    share, and a vision-language model built on them must break that symmetry before any colour
    can be read from the image (reports/reference/mini/README.md, eighth round). A real BERT's words
    each have contexts of their own. A wider start keeps each word's identity through the short
    training."""
    weight = model.get_input_embeddings().weight
    with torch.no_grad():
        weight.normal_(0.0, std)
        if model.config.pad_token_id is not None:
            weight[model.config.pad_token_id].zero_()


class BertInitStage(Stage):
    """Masked language modelling of a new small BERT on the text corpus into `out`: no validation,
    the last epoch's weights kept, saved with the tokenizer as out/bert (what every family loads)."""

    validates = False
    data_parallel = False

    def __init__(self, preset: dict, data_root, out, processor):
        self.preset, self.data_root, self.out, self.processor = preset, data_root, Path(out), processor
        self.seed = preset["seed"]

    def setup_data(self) -> None:
        self.options = self.preset["bert_init"]
        self.processor = world_processor(self.preset, self.data_root, self.processor)
        self.corpus_path = Path(self.data_root) / "text_corpus" / "corpus.txt"
        self.corpus = CorpusDataset(self.corpus_path)
        self.collate = TextOnlyCollator(self.processor)
        self.batch_size = self.options["batch_size"]
        self.batches_per_epoch = math.ceil(len(self.corpus) / self.batch_size)
        self.epochs = int(self.options["epochs"])

    def setup_model(self) -> None:
        model_options = self.preset["model"]
        config = BertConfig(
            vocab_size=len(self.processor.tokenizer),
            hidden_size=model_options["hidden_size"],
            num_hidden_layers=model_options["num_hidden_layers"],
            num_attention_heads=model_options["num_attention_heads"],
            intermediate_size=model_options["intermediate_size"],
            max_position_embeddings=512,
            type_vocab_size=2,
            attn_implementation="sdpa",
        )
        self.model = BertForMaskedLM(config)
        if model_options.get("word_embedding_std"):
            init_word_embeddings(self.model, float(model_options["word_embedding_std"]))

    def setup_optimizer(self) -> None:
        self.optimizer = build_optimizer(self.model, self.options)
        self.scheduler = build_scheduler(
            self.optimizer, self.options, self.epochs * self.batches_per_epoch, self.batches_per_epoch
        )

    def params(self) -> dict:
        return {
            "bert_init": self.options,
            "model": self.preset["model"],
            "passages": len(self.corpus),
            "vocab_size": len(self.processor.tokenizer),
        }

    def make_batch(self, epoch, b):
        order = epoch_order(len(self.corpus), self.seed, epoch)
        return self.collate(
            [self.corpus[i] for i in order[b * self.batch_size : (b + 1) * self.batch_size]],
            batch_generator(self.seed, epoch, b),
        )

    def training_step(self, model, batch):
        hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        masked = batch["mlm_labels"] != -100
        loss = F.cross_entropy(model.cls(hidden[masked]), batch["mlm_labels"][masked])
        return loss, {"mlm": loss}

    def identity(self) -> dict:
        # What this run is made from: a checkpoint of any other run is not resumed.
        data_root = self.data_root
        texts = world_text_files(data_root) if self.preset["model"].get("wordpiece_vocab_size") else [self.corpus_path]
        return {
            "stage": "bert_init",
            "seed": self.seed,
            "preset": {key: self.preset.get(key) for key in ("model", "bert_init", "training")},
            "inputs": {str(Path(path).relative_to(data_root)): input_identity(path) for path in texts},
        }

    def result(self, state, speed):
        """The BERT checkpoint that every family loads: the last epoch's weights and the tokenizer."""
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.model.save_pretrained(str(self.out / "bert"))
        self.processor.save_pretrained(self.out / "bert")
        return {"steps": state.step, "epochs": self.epochs}, {}


def bert_init(preset: dict, data_root, out, tracker, processor, progress: bool = True) -> dict:
    """Train the study's BERT into `out` (out/bert: weights and tokenizer); a summary."""
    return run_stage(BertInitStage(preset, data_root, out, processor), tracker, progress=progress)
