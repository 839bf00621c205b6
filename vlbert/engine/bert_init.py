"""The embedded default's stand-in for BERT's own pre-training: text-only masked language
modelling of a small BERT (transformers' BertForMaskedLM) on the synthetic text corpus, with
BERT's uncased WordPiece tokenizer. The paper preset names a real BERT checkpoint instead."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM

from .data import CorpusDataset, TextOnlyCollator
from .loop import LoopConfig, TrainingLoop
from .optim import build_optimizer, build_scheduler
from .seeding import batch_generator, epoch_order


def bert_init(preset: dict, corpus_path, out, tracker, processor, progress: bool = True) -> dict:
    model_options, options = preset["model"], preset["bert_init"]
    seed = preset["seed"]
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=processor.tokenizer.vocab_size, hidden_size=model_options["hidden_size"],
                        num_hidden_layers=model_options["num_hidden_layers"],
                        num_attention_heads=model_options["num_attention_heads"],
                        intermediate_size=model_options["intermediate_size"],
                        max_position_embeddings=512, type_vocab_size=2, attn_implementation="sdpa")
    model = BertForMaskedLM(config)
    corpus = CorpusDataset(corpus_path)
    collate = TextOnlyCollator(processor)
    batch_size = options["batch_size"]
    batches = math.ceil(len(corpus) / batch_size)
    epochs = int(options["epochs"])
    optimizer = build_optimizer(model, options)
    scheduler = build_scheduler(optimizer, options, epochs * batches, batches)
    tracker.log_params({"bert_init": options, "model": model_options, "passages": len(corpus)})

    def make_batch(epoch, b):
        order = epoch_order(len(corpus), seed, epoch)
        return collate([corpus[i] for i in order[b * batch_size:(b + 1) * batch_size]], batch_generator(seed, epoch, b))

    def loss_fn(model, batch):
        hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        masked = batch["mlm_labels"] != -100
        loss = F.cross_entropy(model.cls(hidden[masked]), batch["mlm_labels"][masked])
        return loss, {"mlm": loss}

    loop = TrainingLoop(model, optimizer, scheduler, LoopConfig(epochs, batches, **preset.get("training", {})),
                        out, make_batch, loss_fn, tracker, progress=progress)
    state = loop.fit()
    # The BERT checkpoint that VL-BERT loads: the last epoch's weights and the tokenizer.
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    model.save_pretrained(str(out / "bert"))
    processor.save_pretrained(out / "bert")
    return {"steps": state.step, "epochs": epochs}
