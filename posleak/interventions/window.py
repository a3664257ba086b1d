"""`--window W|global` (docs/method.md §9): every layer's attention window set to W, or removed, inside the
attention function."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from posleak.errors import PosleakError
from posleak.interventions.base import Intervention, setting
from posleak.interventions.heads import SinkHeads
from posleak.validate import Problems, natural_number

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from posleak.capture.masks import MaskSpec
    from posleak.capture.session import AttentionEdits
    from posleak.models.load import LoadedModel


@dataclass(frozen=True)
class Window(Intervention):
    name = "window"

    width: str | None = setting("window", metavar="W|global")

    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        found = Problems()
        with found.collecting():
            if self.width is not None:
                parse_window(self.width)
        return found.found

    def edit_attention(
        self,
        edits: AttentionEdits,
        sink_heads: SinkHeads | None,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase | None,
    ) -> None:
        assert self.width is not None  # installed only where given
        width = parse_window(self.width)
        edits.add_mask_edit(WindowOverride(None if width == "global" else width))


@dataclass(frozen=True)
class WindowOverride:
    """A mask edit (posleak.capture.AttentionEdits.mask_edits): the layer's window set to `window` (None: no window),
    its causality and prefix kept. A `MaskSpec` is a dataclass, so the edit needs no torch to import."""

    window: int | None

    def __call__(self, spec: MaskSpec) -> MaskSpec:
        return replace(spec, window=self.window)


def parse_window(spec: str) -> int | Literal["global"]:
    """`--window` syntax: a width W ≥ 1, or `global`."""
    if spec == "global":
        return "global"
    width = natural_number(spec)
    if width is None or not 1 <= width < 2**31:
        raise PosleakError(f"bad --window {spec!r}; use a width 1 ≤ W < 2^31 or 'global'")
    return width
