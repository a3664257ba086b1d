"""The check to run on a machine with a GPU (or any device): parity first, then speed, printed as ratios.

1. Capture parity: every hidden state of a tiny model of each family (tests/tiny.py) with posleak's
   captured attention (the device's fused kernel, or its block-wise path) against transformers' eager
   attention on the same device and dtype: the largest difference relative to the state's largest value.
2. Decomposition parity: every column of posleak's tables against the float64 brute force of tests/reference.py
   (independent code: it forms every logit of the recorded q and k), at a small T, for the tiny families and the
   built-in models: the largest relative error (float32 models; the brute force recomputes log Z from q and k).
3. Speed: `analyze` (defaults, batch 1) against the plain forward (`model(input_ids)`, SDPA) on the same
   sequences, at T = 2048 and 8192, for the built-in models: seconds and the ratio analyze / forward.

    python benchmarks/device_check.py                                   # the whole check on the best device
    python benchmarks/device_check.py --device cuda --dtype bfloat16    # speed in bfloat16 (parity stays float32)
    python benchmarks/device_check.py --device cpu --lengths 64 --models smollm2-135m --num-seqs 2   # a smoke run
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference and tiny models live there

from harness import analyze_recorded, errors_of
from tiny import FAMILIES, tiny_model

from posleak.capture import CaptureSession, QueryStats, use_posleak_attention
from posleak.device import Placement
from posleak.models.load import load_model
from posleak.models.zoo import ZOO
from posleak.pipeline import AnalyzeConfig, PreparedRun, analyze_model, sequences_for
from posleak.store.jsonfile import dumps


def _ids(vocab: int, batch: int, seq_len: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


def capture_parity(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Largest |posleak − eager| over every hidden state, relative to that state's largest |eager| value (real
    models carry activations in the thousands, where float32 spacing alone is 1e-4)."""
    device = model.get_input_embeddings().weight.device
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(ids.to(device), output_hidden_states=True, use_cache=False).hidden_states
    use_posleak_attention(model)
    session = CaptureSession([QueryStats()])
    with session.active(torch.arange(ids.shape[0])), torch.no_grad():
        ours = model(ids.to(device), output_hidden_states=True, use_cache=False).hidden_states
    return max(
        float((a.float() - b.float()).abs().max() / a.float().abs().max()) for a, b in zip(eager, ours, strict=True)
    )


def decomposition_parity(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Largest relative error of any table column against the float64 brute force."""
    result, recorder = analyze_recorded(model, ids)
    return max(errors_of(result, recorder).values())


def speed(name: str, placement: Placement, seq_len: int, num_seqs: int) -> dict[str, float]:
    loaded = load_model(name, placement=placement)
    config = AnalyzeConfig(seq_len=seq_len, num_seqs=num_seqs, batch_size=1, cross_documents=True)
    batch = sequences_for(loaded, config.recipe)
    model, device = loaded.model, placement.torch_device()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    model.set_attn_implementation("sdpa")
    with torch.no_grad():  # warm-up: kernel selection and first allocations are not the forward's cost
        model(batch.ids[:1, :16].to(device), use_cache=False)
    start = time.perf_counter()
    with torch.no_grad():
        for row in batch.ids:
            model(row[None].to(device), use_cache=False)
    sync()
    forward_s = time.perf_counter() - start
    use_posleak_attention(model)
    start = time.perf_counter()
    analyze_model(PreparedRun.of(loaded, batch, config), progress=False)
    sync()
    analyze_s = time.perf_counter() - start
    return {
        "forward_s": round(forward_s, 3),
        "analyze_s": round(analyze_s, 3),
        "ratio": round(analyze_s / forward_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="float32", help="for the speed runs; parity runs in float32")
    parser.add_argument("--models", nargs="+", default=list(ZOO))
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--num-seqs", type=int, default=4)
    parser.add_argument("--parity-len", type=int, default=48)
    args = parser.parse_args()

    parity = Placement(device=args.device)
    if problems := parity.problems() + Placement(device=args.device, dtype=args.dtype).problems():
        sys.exit("device_check: " + "; ".join(problems))
    device = parity.torch_device()
    print(f"device {device}, torch {torch.__version__}", flush=True)
    rows = []
    for family in FAMILIES:
        model = tiny_model(family).to(device)
        ids = _ids(model.config.vocab_size, 4, args.parity_len)
        row = {"model": f"tiny {family}", "capture_vs_eager": capture_parity(model, ids)}
        row["decomposition_vs_brute_force"] = decomposition_parity(use_posleak_attention(model), ids)
        rows.append(row)
        print(dumps(row), flush=True)
    for name in args.models:
        loaded = load_model(name, placement=parity)
        ids = _ids(loaded.facts.vocab_size, 4, args.parity_len)
        row = {"model": name, "capture_vs_eager": capture_parity(loaded.model, ids)}
        row["decomposition_vs_brute_force"] = decomposition_parity(loaded.model, ids)
        rows.append(row)
        print(dumps(row), flush=True)
        del loaded
    print("\nparity               capture − eager (rel)   tables vs brute force (rel)")
    for row in rows:
        print(f"{row['model']:<20} {row['capture_vs_eager']:<23.2e} {row['decomposition_vs_brute_force']:.2e}")

    placement = Placement(device=args.device, dtype=args.dtype)
    print(f"\nspeed ({args.dtype}, N = {args.num_seqs}, batch 1)   T   forward s   analyze s   analyze / forward")
    for name in args.models:
        for seq_len in args.lengths:
            result = speed(name, placement, seq_len, args.num_seqs)
            print(f"{name:<20} {seq_len:>16} {result['forward_s']:>11} {result['analyze_s']:>11} {result['ratio']:>8}")


if __name__ == "__main__":
    main()
