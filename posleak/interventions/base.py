"""The protocol every intervention module follows (`Intervention`), and the options it declares (`Option`).

An intervention is one module (docs/method.md §9): its options, the first of which turns it on; what is wrong
with their values (`problems`); what the manifest records of them (`describe`); and how it is installed, at one
or more of three moments of a run: the model's config at load time (`load_overrides`), edits inside the
attention function (`edit_attention`), forward hooks around the forwards (`hooks`). `posleak.interventions.registry`
lists them by name; `posleak.interventions.spec.Interventions` holds one run's values of every registered option.

The command line builds its options from the registry without importing torch, so an intervention module
imports its machinery (torch, transformers) inside the methods that use it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from posleak.interventions.heads import SinkHeads, chosen_heads

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

    from posleak.capture.session import AttentionEdits
    from posleak.models.load import LoadedModel

# One run's value of every registered option, by option name (defaults filled in).
Values = Mapping[str, Any]


@dataclass(frozen=True)
class Option:
    """One option of an intervention: `--name-with-dashes` on the command line, a string value (or None)."""

    name: str
    default: str | int | None = None
    metavar: str | None = None
    help: str | None = None
    choices: tuple[str, ...] | None = None
    # False: the value is an analysis option's of the same name (`seed` is --seed's), not a flag of its own
    flag: bool = True

    @property
    def flag_name(self) -> str:
        return "--" + self.name.replace("_", "-")


class Intervention(ABC):
    """One intervention: its options and how they are checked, recorded and installed."""

    name: ClassVar[str]
    options: ClassVar[tuple[Option, ...]]  # the first one turns it on (a value other than None)
    # whether `load_overrides` changes the model's config: the model is then loaded with them (posleak.pipeline.prepare)
    at_load: ClassVar[bool] = False
    # the manifest's key for the heads an `auto` chose (`needs_sink_heads`), for one that reads sink heads
    chosen_heads_key: ClassVar[str | None] = None

    def given(self, values: Values) -> bool:
        """Whether the run applies this intervention."""
        return values[self.options[0].name] is not None

    @abstractmethod
    def problems(self, values: Values, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        """Everything wrong with its options' values (given or not), one message each, computing nothing on the
        model: their syntax always; with the `model` (None: it did not load) what they name in it; with
        `bos_at_0` (None: not known) whether a BOS stands at position 0 where one is needed."""

    def describe(self, values: Values, sink_heads: SinkHeads | None) -> dict[str, Any]:
        """What the manifest records of it, where given: its options that have a value, and the heads an `auto`
        chose (under `chosen_heads_key`)."""
        described = {option.name: values[option.name] for option in self.options if values[option.name] is not None}
        if self.chosen_heads_key and sink_heads is not None and self.needs_sink_heads(values):
            described[self.chosen_heads_key] = chosen_heads(sink_heads)
        return described

    def needs_sink_heads(self, values: Values) -> bool:
        """Whether installing it needs the sink heads of a baseline pass (an `auto` among its heads)."""
        return False

    def load_overrides(self, values: Values, config: PretrainedConfig) -> dict[str, Any]:
        """What it changes in the model's config, applied when the model loads."""
        return {}

    def edit_attention(  # noqa: B027 (most interventions edit no attention call)
        self,
        values: Values,
        edits: AttentionEdits,
        sink_heads: SinkHeads | None,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase | None,
    ) -> None:
        """Add its edits inside the attention function to `edits`: mask edits, output edits, each applied after
        those of the interventions registered before it."""

    def hooks(
        self, values: Values, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, bos_at_0: bool
    ) -> AbstractContextManager[None]:
        """The forward hooks it installs, for the duration of the block."""
        return nullcontext()
