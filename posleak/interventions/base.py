"""The protocol every intervention module follows (`Intervention`), a frozen dataclass of its own settings, and
the option each setting is given by (`setting`, `Option`).

An intervention is one module (docs/method.md §9): its settings, the first of which turns it on; what is wrong
with them (`problems`); what the manifest records of them (`describe`); and how it is installed, at one or more
of three moments of a run: the model's config at load time (`load_overrides`), edits inside the attention
function (`edit_attention`), forward hooks around the forwards (`hooks`). `posleak.interventions.registry` lists
them; `posleak.interventions.spec.Interventions` holds one run's interventions.

Each setting is a dataclass field made by `setting`, which names the option that gives it (`--name-with-dashes`
on the command line, `name_with_underscores` in batch files, the manifest and the fingerprint): the command line,
batch files and the manifest are made from the fields, so a new intervention declares its options once.

The command line builds its options from the registry without importing torch, so an intervention module
imports its machinery (torch, transformers) inside the methods that use it.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from posleak.interventions.heads import SinkHeads, chosen_heads

if TYPE_CHECKING:
    from typing import Self

    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

    from posleak.capture.session import AttentionEdits
    from posleak.models.load import LoadedModel

_OPTION = "option"  # the key of a setting's `Option` in its field's metadata


@dataclass(frozen=True)
class Option:
    """The option that gives one setting: `--name-with-dashes` on the command line, `name` elsewhere; a string
    value (or None)."""

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


def setting(
    name: str,
    default: str | int | None = None,
    *,
    metavar: str | None = None,
    help: str | None = None,
    choices: tuple[str, ...] | None = None,
    flag: bool = True,
) -> Any:
    """A field of an intervention's settings, given by the option `name` (see `Option`)."""
    option = Option(name, default, metavar, help, choices, flag)
    return dataclasses.field(default=default, metadata={_OPTION: option})


@dataclass(frozen=True)
class Intervention(ABC):
    """One intervention: its settings (the dataclass's fields, each made by `setting`) and how they are checked,
    recorded and installed."""

    name: ClassVar[str]
    # whether `load_overrides` changes the model's config: the model is then loaded with them (posleak.pipeline.prepare)
    at_load: ClassVar[bool] = False
    # the manifest's key for the heads an `auto` chose (`needs_sink_heads`), for one that reads sink heads
    chosen_heads_key: ClassVar[str | None] = None

    @classmethod
    def options(cls) -> tuple[Option, ...]:
        """The options of its settings, in field order; the first one turns it on."""
        return tuple(field.metadata[_OPTION] for field in dataclasses.fields(cls))

    @classmethod
    def from_options(cls, values: Mapping[str, Any]) -> Self:
        """The intervention with the settings `values` gives by option name (the others at their defaults)."""
        fields = dataclasses.fields(cls)
        return cls(**{f.name: values[f.metadata[_OPTION].name] for f in fields if f.metadata[_OPTION].name in values})

    def option_values(self) -> dict[str, Any]:
        """Every setting, by option name."""
        return {field.metadata[_OPTION].name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def changed(self) -> dict[str, Any]:
        """The settings away from their defaults, by option name: what a run's fingerprint covers of it."""
        defaults = {option.name: option.default for option in self.options()}
        return {name: value for name, value in self.option_values().items() if value != defaults[name]}

    @property
    def given(self) -> bool:
        """Whether the run applies it (its first setting has a value; the others alone apply nothing)."""
        return next(iter(self.option_values().values())) is not None

    @abstractmethod
    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        """Everything wrong with its settings (given or not), one message each, computing nothing on the model:
        their syntax always; with the `model` (None: it did not load) what they name in it; with `bos_at_0`
        (None: not known) whether a BOS stands at position 0 where one is needed."""

    def describe(self, sink_heads: SinkHeads | None) -> dict[str, Any]:
        """What the manifest records of it, where given: its settings that have a value, and the heads an `auto`
        chose (under `chosen_heads_key`)."""
        described = {name: value for name, value in self.option_values().items() if value is not None}
        if self.chosen_heads_key and sink_heads is not None and self.needs_sink_heads():
            described[self.chosen_heads_key] = chosen_heads(sink_heads)
        return described

    def needs_sink_heads(self) -> bool:
        """Whether installing it needs the sink heads of a baseline pass (an `auto` among its heads)."""
        return False

    def load_overrides(self, config: PretrainedConfig) -> dict[str, Any]:
        """What it changes in the model's config, applied when the model loads."""
        return {}

    def edit_attention(  # noqa: B027 (most interventions edit no attention call)
        self,
        edits: AttentionEdits,
        sink_heads: SinkHeads | None,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase | None,
    ) -> None:
        """Add its edits inside the attention function to `edits`: mask edits, output edits, each applied after
        those of the interventions registered before it."""

    def hooks(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, bos_at_0: bool
    ) -> AbstractContextManager[None]:
        """The forward hooks it installs, for the duration of the block."""
        return nullcontext()
