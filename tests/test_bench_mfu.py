"""bench/mfu.py: the FLOPs it counts for a step and the peak it divides them by."""

from pathlib import Path

import pytest
from conftest import load_bench

BENCH = Path(__file__).resolve().parent.parent / "bench" / "mfu.py"


def _bench():
    return load_bench(BENCH, "mfu")


def test_a_step_s_flops_are_six_per_weight_and_token_plus_attention():
    mfu = _bench()
    # BERT-base's 85 M parameters outside the embeddings, 32 x 77 tokens: 6 N T + 12 L d S T.
    tokens = 32 * 77
    assert (
        mfu.model_flops_per_step(85_000_000, 12, 768, 32, 77) == 6 * 85_000_000 * tokens + 12 * 12 * 768 * 77 * tokens
    )


def test_the_peak_is_given_or_the_card_s_or_measured_on_the_cpu(monkeypatch):
    mfu = _bench()
    assert mfu.peak_flops("cuda", "bf16", 500.0) == (500e12, "given (--peak-tflops)")
    peak, source = mfu.peak_flops("cpu", "fp32", None)
    assert peak > 1e9 and "2048^3 fp32 matmul" in source
    monkeypatch.setattr(mfu.torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert mfu.peak_flops("cuda", "bf16", None) == (989e12, "NVIDIA H100 80GB HBM3's data sheet")
    assert mfu.peak_flops("cuda", "fp32", None)[0] == 989e12 / 2
    monkeypatch.setattr(mfu.torch.cuda, "get_device_name", lambda device: "a card")
    with pytest.raises(SystemExit, match="no peak figure for a card"):
        mfu.peak_flops("cuda", "bf16", None)
