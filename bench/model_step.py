"""Benchmark: one pre-training step of each system against transformers' BertModel of the same text size.

Each runs forward, backward and an AdamW step on the same batch size and the same total sequence
length (text + RoIs), masked language modelling on the same positions:
  - bert:     BertModel on token ids, with BERT's MLM head scoring the masked positions;
  - vlbert:   VLBertForPreTraining with the Fast R-CNN frozen and cached RoI features (MLM only);
  - +roi:     the same with masked RoI classification as well (the pre-training head);
  - +tune:    tune_frcnn on: features recomputed from the images by the Fast R-CNN, which trains;
  - vilbert:  ViLBertForPreTraining (two streams, co-attention before the last text layers),
              masked words, masked regions and alignment on cached features;
  - pixelbert: PixelBertForPreTraining, masked words and matching, its CNN training on the
              images, with every pixel token and with pixel sampling.
Target: vlbert / bert <= 1.10. Sizes default to the mini preset's.

    python bench/model_step.py [--detector results/mini/detector] [--batch 32] [--text 24] [--rois 10]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel
from transformers.models.bert.modeling_bert import BertOnlyMLMHead

from vlbert.detection.model import DetectorConfig, build_faster_rcnn
from vlbert.modeling import (
    PixelBertConfig,
    PixelBertForPreTraining,
    StudyProcessor,
    ViLBertConfig,
    ViLBertForPreTraining,
    VLBertConfig,
    VLBertForPreTraining,
)
from vlbert.modeling.inputs import VisualInputs
from vlbert.modeling.processing_study import pad_batch

SIZE = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512, vocab_size=30522)


def timed(step, repeats: int) -> float:
    step()
    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]  # median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--detector", help="detector folder (default: an untrained mini-sized one)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--text", type=int, default=24, help="text tokens per example")
    parser.add_argument("--rois", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--visual-layers", type=int, default=2, help="ViLBERT's visual stream (and co-attention) layers"
    )
    parser.add_argument("--pixel-samples", type=int, default=14, help="Pixel-BERT's sampled pixel tokens per image")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    if args.detector:
        from vlbert.detection.model import load_detector

        detector, det_config = load_detector(args.detector)
    else:
        det_config = DetectorConfig(class_names=[str(i) for i in range(6)])
        detector = build_faster_rcnn(det_config).eval()
    processor = StudyProcessor.from_pretrained()
    text = " ".join(["word"] * (args.text - 2))
    encodings = pad_batch([processor.encode(text, num_rois=args.rois)] * args.batch)
    length = encodings["input_ids"].shape[1]
    mlm_labels = torch.full_like(encodings["input_ids"], -100)
    mlm_labels[:, 1 : args.text - 1 : 6] = 2773

    images = [torch.rand(3, det_config.image_size, det_config.image_size) for _ in range(args.batch)]
    boxes = torch.tensor(
        [[0, 0, 96, 96]] + [[8 * k, 8 * k, 8 * k + 30, 8 * k + 30] for k in range(args.rois)], dtype=torch.float32
    ).expand(args.batch, -1, -1)
    sizes = torch.tensor([[96, 96]]).expand(args.batch, -1)
    valid = torch.ones(args.batch, args.rois + 1, dtype=torch.bool)
    features = torch.rand(args.batch, args.rois + 1, det_config.feature_dim)
    roi_labels = torch.full((args.batch, args.rois + 1), -100)
    roi_labels[:, 1:4] = 2

    def vlbert_step(tune: bool, with_roi: bool, cached: bool):
        config = VLBertConfig(
            **SIZE,
            visual_feature_dim=det_config.feature_dim,
            frcnn=det_config.to_json(),
            tune_frcnn=tune,
            num_visual_classes=det_config.num_classes,
        )
        model = VLBertForPreTraining(config).train()
        vlbert_step.models.append(model)
        model.vlbert.fast_rcnn.load_detector_state(detector.state_dict())
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        visual = VisualInputs(boxes, sizes, valid, features if cached else None, None if cached else images)
        batch = dict(encodings) if with_roi else {k: v for k, v in encodings.items() if k != "roi_positions"}

        def step():
            out = model(**batch, visual=visual, mlm_labels=mlm_labels, roi_labels=roi_labels if with_roi else None)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            optimizer.step()

        return step

    common = dict(
        visual_feature_dim=det_config.feature_dim,
        frcnn=det_config.to_json(),
        num_visual_classes=det_config.num_classes,
    )
    distributions = torch.zeros(args.batch, args.rois + 1, det_config.num_classes)
    distributions[:, 1:4] = torch.softmax(torch.randn(args.batch, 3, det_config.num_classes), -1)
    masked_regions = distributions.sum(-1) > 0
    relation = (torch.arange(args.batch) % 2).float()

    def vilbert_step():
        model = ViLBertForPreTraining(ViLBertConfig(**SIZE, **common, num_visual_layers=args.visual_layers)).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        visual = VisualInputs(boxes, sizes, valid, features, None, masked_regions)

        def step():
            out = model(
                **encodings, visual=visual, mlm_labels=mlm_labels, roi_labels=distributions, relation_labels=relation
            )
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            optimizer.step()

        return model, step

    def pixelbert_step(samples: int):
        model = PixelBertForPreTraining(PixelBertConfig(**SIZE, **common, pixel_samples=samples)).train()
        model.pixelbert.cnn.load_detector_state(detector.state_dict())
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        visual = VisualInputs(boxes, sizes, valid, features, images)

        def step():
            out = model(**encodings, visual=visual, mlm_labels=mlm_labels, relation_labels=relation)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            optimizer.step()

        return model, step

    vlbert_step.models = []
    bert_config = BertConfig(**SIZE, type_vocab_size=3, attn_implementation="sdpa")
    bert, head = BertModel(bert_config, add_pooling_layer=False).train(), BertOnlyMLMHead(bert_config)
    bert_optimizer = torch.optim.AdamW(list(bert.parameters()) + list(head.parameters()), lr=1e-4)
    masked = mlm_labels != -100

    def bert_step():
        hidden = bert(
            input_ids=encodings["input_ids"],
            token_type_ids=encodings["token_type_ids"],
            attention_mask=encodings["attention_mask"],
        ).last_hidden_state
        loss = F.cross_entropy(head(hidden[masked]), mlm_labels[masked])
        bert_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        bert_optimizer.step()

    # Interleave the two main contenders so both see the same machine state.
    vl = vlbert_step(tune=False, with_roi=False, cached=True)
    bert_times, vl_times = [], []
    for _ in range(3):
        bert_times.append(timed(bert_step, args.repeats // 3 + 1))
        vl_times.append(timed(vl, args.repeats // 3 + 1))
    bert_s, vl_s = min(bert_times), min(vl_times)
    roi_s = timed(vlbert_step(tune=False, with_roi=True, cached=True), args.repeats)
    recompute_s = timed(vlbert_step(tune=False, with_roi=True, cached=False), args.repeats)
    tune_s = timed(vlbert_step(tune=True, with_roi=True, cached=False), args.repeats)
    vilbert, vilbert_run = vilbert_step()
    vilbert_s = timed(vilbert_run, args.repeats)
    pixelbert, pixelbert_all = pixelbert_step(0)
    pixel_all_s = timed(pixelbert_all, args.repeats)
    pixel_sampled_s = timed(pixelbert_step(args.pixel_samples)[1], args.repeats)
    vlbert = vlbert_step.models[0]
    sizes_m = {
        "bert": sum(p.numel() for p in [*bert.parameters(), *head.parameters()]) / 1e6,
        "vlbert": sum(p.numel() for n, p in vlbert.named_parameters() if ".fast_rcnn." not in n) / 1e6,
        "vilbert": sum(p.numel() for p in vilbert.parameters()) / 1e6,
        "pixelbert": sum(p.numel() for p in pixelbert.parameters()) / 1e6,
    }

    print(
        f"batch {args.batch}, sequence {length} ({args.text} text + {args.rois} RoIs + [END]), "
        f"hidden {SIZE['hidden_size']} x {SIZE['num_hidden_layers']} layers, {args.threads} threads"
    )
    print(f"{'step':44} {'ms':>8} {'vs bert':>8}")
    for name, seconds in [
        ("BertModel + MLM head", bert_s),
        ("VL-BERT, cached features, MLM", vl_s),
        ("VL-BERT, cached, MLM + masked RoI", roi_s),
        ("VL-BERT, frozen Fast R-CNN recomputing", recompute_s),
        ("VL-BERT, tune_frcnn on", tune_s),
        (f"ViLBERT, {args.visual_layers} visual + co-attention layers", vilbert_s),
        ("Pixel-BERT, every pixel token", pixel_all_s),
        (f"Pixel-BERT, {args.pixel_samples} sampled pixel tokens", pixel_sampled_s),
    ]:
        print(f"{name:44} {1000 * seconds:8.1f} {seconds / bert_s:8.2f}")
    print(
        f"parameters (M): BertModel + MLM head {sizes_m['bert']:.2f} (decoder untied), "
        f"VL-BERT without its Fast R-CNN {sizes_m['vlbert']:.2f}, ViLBERT {sizes_m['vilbert']:.2f} "
        f"({sizes_m['vilbert'] / sizes_m['vlbert']:.2f}x VL-BERT), Pixel-BERT with its CNN {sizes_m['pixelbert']:.2f} "
        f"({sizes_m['pixelbert'] / sizes_m['vlbert']:.2f}x)"
    )
    print(f"ratio VL-BERT (cached, frozen) / BERT (target <= 1.10): {vl_s / bert_s:.2f}")
    print(f"cost of tune_frcnn on, against cached features: {tune_s / roi_s:.2f}x")


if __name__ == "__main__":
    main()
