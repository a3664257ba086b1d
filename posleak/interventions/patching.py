"""Position-0 patching (docs/method.md §9): h_0^(l) taken from another input at chosen layers.

Position 0 is a closed system (it attends only to itself), so its whole trajectory h_0^(0..L) is a
function of the token there alone: the source trajectory is computed from that one token. A patch
at resid[l] replaces position 0 of the embedding output (l = 0) or of block l − 1's output (l ≥ 1);
the layers after it compute on from the patched state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posleak.capture.residual import ResidualCapture, decoder_layers
from posleak.capture.session import CaptureSession
from posleak.errors import PosleakError
from posleak.validate import natural_number


def source_token(
    tokenizer: PreTrainedTokenizerBase | None,
    source: str,
    vocab_size: int | None = None,
    option: str = "--patch-pos0",
) -> int:
    """The token a SOURCE of `option` (`--patch-pos0`, `--patch-kv0`) names: `id:N` (N < `vocab_size` when
    given), or TEXT of one token."""
    if source.startswith("id:"):
        number = natural_number(source.removeprefix("id:"))
        if number is None or (vocab_size is not None and number >= vocab_size):
            limit = f" below {vocab_size}" if vocab_size is not None else ""
            raise PosleakError(f"bad {option} {source!r}; id:N takes a token id N ≥ 0{limit}")
        return number
    if tokenizer is None:
        raise PosleakError(f"{option} TEXT needs the model's tokenizer; use id:N")
    ids = tokenizer.encode(source, add_special_tokens=False)
    if len(ids) != 1:
        raise PosleakError(f"{option} {source!r} encodes to {len(ids)} tokens; name one token or use id:N")
    return ids[0]


def position0_trajectory(model: PreTrainedModel, token_id: int) -> torch.Tensor:
    """h_0^(l) for every resid index l when `token_id` stands at position 0, shape (L + 1, d)."""
    with ResidualCapture(model, positions=[0]) as capture:
        CaptureSession().forward(model, torch.tensor([[token_id]]))
    return capture.states()[:, 0, 0]


@contextmanager
def patched_position0(model: PreTrainedModel, trajectory: torch.Tensor, layers: Sequence[int]) -> Iterator[None]:
    """Within the block, position 0 of resid[l] is `trajectory[l]` for each l in `layers`."""
    modules = [model.get_input_embeddings(), *decoder_layers(model)]

    def hook_for(layer: int) -> Callable[[nn.Module, object, object], object]:
        def patch(module: nn.Module, inputs: object, output: object) -> object:
            hidden = output[0] if isinstance(output, tuple) else output
            hidden = hidden.clone()
            hidden[:, 0] = trajectory[layer].to(hidden)
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        return patch

    # prepend: captures registered earlier must see the patched state
    handles = [modules[layer].register_forward_hook(hook_for(layer), prepend=True) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def parse_layers(spec: str, num_resid: int) -> tuple[int, ...]:
    """`--patch-layers` syntax: `all`, `L`, `A..B` (inclusive), comma-separated; each a resid index < `num_resid`."""
    if spec == "all":
        return tuple(range(num_resid))
    layers: list[int] = []
    try:
        for part in spec.split(","):
            lo, sep, hi = part.partition("..")
            layers.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        raise PosleakError(f"bad --patch-layers {spec!r}; use all, L, A..B or a comma-separated list") from None
    bad = sorted({layer for layer in layers if not 0 <= layer < num_resid})
    if bad or not layers:
        found = f"names resid indices {bad} that do not exist" if bad else "selects no resid index"
        raise PosleakError(f"--patch-layers {spec!r} {found}; resid indices run 0..{num_resid - 1} (A..B needs A ≤ B)")
    return tuple(layers)
