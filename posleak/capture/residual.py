"""Residual-stream capture with forward hooks, and the closed-system check of docs/method.md §8.

Naming: resid[0] is the embedding module's output (after any scale the model applies inside it,
as Gemma's √d_model), resid[l] for l ≥ 1 is the output of decoder block l − 1, before the final
norm. These are the hidden states h^(l) of docs/method.md; L blocks give L + 1 entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from posleak.errors import PosleakError

# Relative tolerance of "identical": float reductions may be blocked differently for different
# batch shapes, so position 0 can differ in the last bits even though nothing reaches it.
CLOSED_SYSTEM_RTOL = 1e-5


def base_of(model: PreTrainedModel) -> nn.Module:
    """The model without its LM head: `base_model`, or, where the class's `base_model_prefix` names no attribute
    (Llama 4's text model says "language_model" and keeps it as `model`), the one child that is a model."""
    if model.base_model is not model:
        return model.base_model
    children = [child for child in model.children() if isinstance(child, PreTrainedModel)]
    if len(children) != 1:
        raise PosleakError(f"{type(model).__name__}: cannot find its base model (the model without its LM head)")
    return children[0]


def decoder_layers(model: PreTrainedModel) -> nn.ModuleList:
    """The decoder blocks, in order, of any transformers causal LM posleak supports, found from the model's own
    structure: the first module list (breadth-first under the base model) with one entry per hidden layer of
    its text config: `layers` for most families, `h` for GPT-J and CodeGen, `language_model.layers` for a
    multimodal wrapper."""
    count = getattr(model.config.get_text_config(decoder=True), "num_hidden_layers", None)
    queue: list[nn.Module] = [base_of(model)]
    while queue:
        module = queue.pop(0)
        for child in module.children():
            if isinstance(child, nn.ModuleList) and len(child) > 0 and (count is None or len(child) == count):
                return child
            queue.append(child)
    raise PosleakError(
        f"{type(model).__name__}: cannot find its decoder layers (no module list of {count} blocks in the model)"
    )


def skipped_layers(model: PreTrainedModel) -> dict[int, str]:
    """The decoder blocks without attention over positions (a hybrid's mamba, convolution or linear-attention
    layers), by layer index: "mamba, not attention". transformers' attention modules declare `is_causal`;
    its mixers of other kinds do not."""
    skipped = {}
    for index, block in enumerate(decoder_layers(model)):
        if not any(hasattr(module, "is_causal") for module in block.modules()):
            kinds = [type(module).__name__ for module in block.children()]
            mixer = next(
                (kind for kind in kinds if not kind.endswith(("Norm", "MLP", "RMSNorm"))), type(block).__name__
            )
            skipped[index] = f"{mixer}, not attention"
    return skipped


class ResidualCapture:
    """Keeps h_i^(l) at `positions` for `layers` (indices into resid, default all) over every forward
    run inside the `with` block. `states()` gives a tensor (layers, N, positions, d)."""

    def __init__(
        self, model: PreTrainedModel, positions: Sequence[int] = (0,), layers: Sequence[int] | None = None
    ) -> None:
        self.model = model
        self.positions = list(positions)
        num_blocks = len(decoder_layers(model))
        self.layers = list(range(num_blocks + 1)) if layers is None else list(layers)
        self._kept: dict[int, list[torch.Tensor]] = {layer: [] for layer in self.layers}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> ResidualCapture:
        modules = [self.model.get_input_embeddings(), *decoder_layers(self.model)]
        for layer in self.layers:
            self._handles.append(modules[layer].register_forward_hook(self._hook(layer)))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, layer: int) -> Callable[[nn.Module, object, object], None]:
        def keep(module: nn.Module, inputs: object, output: object) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            # a block with S residual streams (hyper-connections) outputs (N, T, S, d): keep the S·d of each position
            self._kept[layer].append(hidden[:, self.positions].flatten(2).detach().float().cpu().clone())

        return keep

    def states(self) -> torch.Tensor:
        """(layers, N, positions, width): a layer's streams concatenated, those narrower than the widest (the
        embedding's one stream before a hyper-connection model makes S of it) padded with zeros."""
        kept = [torch.cat(self._kept[layer]) for layer in self.layers]
        width = max(state.shape[-1] for state in kept)
        return torch.stack([F.pad(state, (0, width - state.shape[-1])) for state in kept])


@dataclass
class ClosedSystemReport:
    """Largest relative spread of h_0^(l) among inputs sharing the token at position 0, per layer."""

    max_rel_spread: torch.Tensor  # (layers,)
    groups: int  # distinct position-0 tokens that had ≥ 2 inputs

    @property
    def holds(self) -> bool:
        return bool((self.max_rel_spread <= CLOSED_SYSTEM_RTOL).all())


def closed_system(pos0_states: torch.Tensor, pos0_inputs: torch.Tensor) -> ClosedSystemReport:
    """pos0_states (layers, N, d): h_0^(l) per input; pos0_inputs (N,) or (N, d): what stands at
    position 0 — the token, or the input vector itself when an intervention replaced it. Inputs whose
    position-0 entries are equal must share h_0 in every layer."""
    _, group = torch.unique(pos0_inputs, dim=0, return_inverse=True)
    spread = torch.zeros(pos0_states.shape[0], dtype=torch.float64)
    groups = 0
    for g in group.unique():
        rows = pos0_states[:, group == g].double()
        if rows.shape[1] < 2:
            continue
        groups += 1
        deviation = (rows - rows[:, :1]).abs().amax(dim=(1, 2))
        scale = rows.abs().amax(dim=(1, 2)).clamp_min(1e-30)
        spread = torch.maximum(spread, deviation / scale)
    return ClosedSystemReport(max_rel_spread=spread, groups=groups)


def require_closed_system(report: ClosedSystemReport) -> None:
    """Raise naming the first layer where position 0 saw later tokens: a non-causal model or a bug."""
    if report.holds:
        return
    bad = int((report.max_rel_spread > CLOSED_SYSTEM_RTOL).nonzero()[0])
    raise PosleakError(
        f"closed-system check failed at resid[{bad}]: h_0 differs by {report.max_rel_spread[bad]:.3g} (relative) "
        "between inputs sharing the token at position 0, so position 0 sees later tokens; the model or "
        "its attention mask is not causal"
    )
