"""The interventions of one run (docs/method.md §9): a tuple of registered interventions, each a frozen dataclass
of its own settings (posleak.interventions.registry), and what is checked, recorded and installed of them, one
intervention after another in the registry's order.

`Interventions(ReplaceBos("mean"), RopeScaling("ntk:4"))` gives some; `Interventions.from_options(replace_bos=
"mean")` makes them from options by name, as the command line and batch files give them (the one place those names
are read); `interventions.get(ReplaceBos)` is the one given of a kind. `describe()` is what the manifest records,
`to_dict()` what the fingerprint covers and `problems(model, bos_at_0)` what is wrong with them, checked before any
forward pass. Where each acts: at load time (`config_overrides`), inside the attention function
(`attention_edits`) or as forward hooks (`applied`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from posleak.interventions.base import Intervention
from posleak.interventions.heads import SinkHeads
from posleak.interventions.registry import option_defaults, registered

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

    from posleak.capture.session import AttentionEdits
    from posleak.models.load import LoadedModel

Kind = TypeVar("Kind", bound=Intervention)


@dataclass(frozen=True, init=False)
class Interventions:
    """One run's interventions, in the registry's order, each with a setting away from its default (one whose
    other settings alone apply nothing, such as `--ablate-mode mean` alone, is kept: the fingerprint covers it);
    immutable, compared and hashed by value."""

    items: tuple[Intervention, ...]

    def __init__(self, *items: Intervention) -> None:
        order = registered()
        if strays := [item for item in items if type(item) not in order]:
            raise TypeError(f"{strays} are not registered interventions; the registered ones are {order}")
        kinds = [type(item) for item in items]
        if twice := sorted({kind.name for kind in kinds if kinds.count(kind) > 1}):
            raise TypeError(f"one run takes each intervention once; {twice} given twice")
        kept = sorted((item for item in items if item.changed()), key=lambda item: order.index(type(item)))
        object.__setattr__(self, "items", tuple(kept))  # how a frozen dataclass sets its fields

    @classmethod
    def from_options(cls, **options: Any) -> Interventions:
        """The interventions the options give by name (`replace_bos="mean"`, `patch_kv0=…, kv0_heads=…`; the others
        keep their defaults)."""
        defaults = option_defaults()
        if unknown := sorted(set(options) - set(defaults)):
            raise TypeError(f"unknown intervention option(s) {unknown}; the registered ones are {sorted(defaults)}")
        return cls(*(kind.from_options(options) for kind in registered()))

    def __repr__(self) -> str:
        return f"Interventions({', '.join(map(repr, self.items))})"

    def get(self, kind: type[Kind]) -> Kind | None:
        """The given intervention of `kind`, if any."""
        return next((item for item in self._given() if type(item) is kind), None)  # type: ignore[misc]

    def to_dict(self) -> dict[str, Any]:
        """The settings away from their defaults, by option name, as a run's fingerprint covers them: registering
        another intervention then changes no run's fingerprint (a run without it resumes as before)."""
        return {name: value for item in self.items for name, value in item.changed().items()}

    def _given(self) -> list[Intervention]:
        return [item for item in self.items if item.given]

    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        """Everything wrong with these options, one message each, without computing anything on the model.

        Their syntax always; with the `model` (None: it did not load) also the layers, heads, tokens and RoPE
        they name; with `bos_at_0` (None: not known) whether a BOS stands at position 0 where one is needed.
        """
        return [problem for item in self.items for problem in item.problems(model, bos_at_0)]

    @property
    def is_empty(self) -> bool:
        return not self._given()

    def describe(self, sink_heads: SinkHeads | None = None) -> dict[str, Any]:
        """The applied interventions, as recorded in the manifest (defaults of unused options dropped), with the
        `sink_heads` an `auto` chose under the name of what was done to them."""
        described: dict[str, Any] = {}
        for intervention in self._given():
            described |= intervention.describe(sink_heads)
        return described

    @property
    def needs_sink_heads(self) -> bool:
        return any(intervention.needs_sink_heads() for intervention in self._given())

    def at_load(self) -> tuple[tuple[str, Any], ...]:
        """The options of the given interventions that change the model as it loads: what tells one loaded model
        of a spec from another."""
        return tuple(
            item
            for intervention in self._given()
            if intervention.at_load
            for item in intervention.describe(None).items()
        )

    def config_overrides(self, config: PretrainedConfig) -> dict[str, Any]:
        """What the load-time interventions change in the model's config."""
        overrides: dict[str, Any] = {}
        for intervention in self._given():
            overrides |= intervention.load_overrides(config)
        return overrides

    def attention_edits(
        self,
        sink_heads: SinkHeads | None = None,
        model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> AttentionEdits:
        """The edits inside the attention function; a key-0 patch needs the `model` (one forward of its source
        token) and, for a SOURCE given as text, its `tokenizer`."""
        from posleak.capture.session import AttentionEdits

        edits = AttentionEdits()
        for intervention in self._given():
            intervention.edit_attention(edits, sink_heads, model, tokenizer)
        return edits

    @contextmanager
    def applied(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, bos_at_0: bool
    ) -> Iterator[None]:
        """Install the forward-hook interventions for the duration of the block."""
        with ExitStack() as stack:
            for intervention in self._given():
                stack.enter_context(intervention.hooks(model, tokenizer, bos_at_0))
            yield
