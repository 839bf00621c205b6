"""Benchmark: the model FLOPs utilisation (MFU) of a BASE-size VL-BERT pre-training step.

A BASE-size VLBertForPreTraining (hidden 768, 12 layers, 12 heads, 3,072 intermediate, BERT's
30,522 words) runs forward, backward and an AdamW step on cached RoI features (the Fast R-CNN
frozen, as in settings a to d), masked language modelling and masked RoI classification, under
bf16 autocast (or fp32). MFU is the model's FLOPs per second over the device's peak, PaLM's
(Chowdhury et al. 2022, appendix B) count: 6 x the parameters outside the embeddings x the
tokens, plus 12 x layers x hidden x sequence length x the tokens for attention. The peak: the
GPU's dense bf16 figure from its data sheet where the bench knows the card (--peak-tflops for
another), on the CPU a large matmul timed here in the same precision.

    python bench/mfu.py                                   # CUDA when present, else the CPU
    python bench/mfu.py --batch 64 --text 40 --rois 36    # the paper's sequence, a bigger batch
    python bench/mfu.py --precision fp32 --device cpu
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

import torch

from vlbert.engine.device import resolve_device

BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, vocab_size=30522)
# Dense bf16 tensor-core TFLOP/s from NVIDIA's data sheets (SXM parts), matched on the device's name.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def model_flops_per_step(non_embedding_params: int, layers: int, hidden: int, batch: int, sequence: int) -> float:
    """Training FLOPs of one step (forward and backward): 6 N T for the weights, 12 L d S T for
    attention's scores and mixing, T = batch x sequence tokens."""
    tokens = batch * sequence
    return 6 * non_embedding_params * tokens + 12 * layers * hidden * sequence * tokens


def peak_flops(device: str, precision: str, given_tflops: float | None) -> tuple[float, str]:
    """The device's peak FLOP/s and where the figure comes from."""
    if given_tflops:
        return given_tflops * 1e12, "given (--peak-tflops)"
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
        for key, tflops in PEAK_BF16_TFLOPS.items():
            if key in name:
                # fp32 runs on TF32 tensor cores at half the bf16 rate.
                return tflops * 1e12 / (1 if precision == "bf16" else 2), f"{name}'s data sheet"
        raise SystemExit(f"no peak figure for {name}: give --peak-tflops")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    a @ b  # warm-up
    runs = 5
    start = time.perf_counter()
    for _ in range(runs):
        a @ b
    return runs * 2 * 2048**3 / (
        time.perf_counter() - start
    ), f"a 2048^3 {precision} matmul on {torch.get_num_threads()} threads"


def main() -> None:
    from vlbert.modeling import VLBertConfig, VLBertForPreTraining
    from vlbert.modeling.inputs import VisualInputs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--text", type=int, default=40, help="text tokens per example")
    parser.add_argument("--rois", type=int, default=36, help="regions per image besides the whole image")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (after two not timed)")
    parser.add_argument("--layers", type=int, default=BASE["num_hidden_layers"], help="fewer for a quick look")
    parser.add_argument("--peak-tflops", type=float, help="the device's peak, where the bench does not know it")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    feature_dim, classes = 1024, 1601  # the paper's detector: Visual Genome's 1,600 classes and background
    size = {**BASE, "num_hidden_layers": args.layers}
    config = VLBertConfig(**size, visual_feature_dim=feature_dim, num_visual_classes=classes, tune_frcnn=False)
    model = VLBertForPreTraining(config).to(device).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    batch, regions = args.batch, args.rois + 1
    sequence = args.text + regions + 1  # text ([CLS] ... [SEP]), [IMG] x (R + 1), [END]
    input_ids = torch.randint(1000, size["vocab_size"], (batch, sequence), device=device)
    tokens = {
        "input_ids": input_ids,
        "token_type_ids": torch.cat(
            [torch.zeros(batch, args.text, dtype=torch.long), torch.full((batch, regions + 1), 2)], 1
        ).to(device),
        "position_ids": torch.arange(sequence, device=device).expand(batch, -1).clamp(max=args.text),
        "visual_index": torch.cat(
            [
                torch.zeros(batch, args.text, dtype=torch.long),
                torch.arange(regions).expand(batch, -1),
                torch.zeros(batch, 1, dtype=torch.long),
            ],
            1,
        ).to(device),
        "attention_mask": torch.ones(batch, sequence, dtype=torch.long, device=device),
        "roi_positions": (args.text + torch.arange(regions)).expand(batch, -1).to(device),
    }
    mlm_labels = torch.full_like(input_ids, -100)
    mlm_labels[:, 1 : args.text - 1 : 7] = 2773  # about 15% of the words
    roi_labels = torch.full((batch, regions), -100, device=device)
    roi_labels[:, 1:regions:7] = 5
    boxes = torch.tensor([[0.0, 0.0, 600.0, 600.0]]).expand(batch, regions, -1).to(device)
    visual = VisualInputs(
        boxes,
        torch.tensor([[600, 600]]).expand(batch, -1).to(device),
        torch.ones(batch, regions, dtype=torch.bool, device=device),
        torch.rand(batch, regions, feature_dim, device=device),
        None,
    )
    autocast = (
        torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if args.precision == "bf16" else nullcontext()
    )

    def step():
        with autocast:
            loss = model(**tokens, visual=visual, mlm_labels=mlm_labels, roi_labels=roi_labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    synchronise = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(2):
        step()
    synchronise()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    synchronise()
    seconds = (time.perf_counter() - start) / args.steps

    embeddings = sum(p.numel() for n, p in model.named_parameters() if "embeddings" in n or "fast_rcnn" in n)
    non_embedding = sum(p.numel() for p in model.parameters()) - embeddings
    flops = model_flops_per_step(non_embedding, size["num_hidden_layers"], size["hidden_size"], batch, sequence)
    peak, source = peak_flops(device, args.precision, args.peak_tflops)
    print(
        f"VL-BERT {size['num_hidden_layers']} x {size['hidden_size']} ({non_embedding / 1e6:.1f} M parameters outside "
        f"the embeddings), batch {batch} x sequence {sequence}, {args.precision} on {device}"
    )
    print(f"step {1000 * seconds:.1f} ms; model {flops / seconds / 1e12:.2f} TFLOP/s")
    print(f"peak {peak / 1e12:.2f} TFLOP/s ({source}); MFU {100 * flops / seconds / peak:.1f}%")


if __name__ == "__main__":
    main()
