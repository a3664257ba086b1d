"""The interventions of one run (docs/method.md §9): the value of every registered intervention's options
(posleak.interventions.registry), and what is checked, recorded and installed of them, one intervention after
another.

`Interventions(replace_bos="mean")` gives some options (the others keep their defaults); each option reads as
an attribute (`interventions.rope_scaling`). `describe()` is what the manifest records and
`problems(model, bos_at_0)` what is wrong with them, checked before any forward pass. Where each acts: at load
time (`config_overrides`), inside the attention function (`attention_edits`) or as forward hooks (`applied`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from posleak.interventions.base import Intervention
from posleak.interventions.heads import SinkHeads
from posleak.interventions.registry import option_defaults, registered

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

    from posleak.capture.session import AttentionEdits
    from posleak.models.load import LoadedModel


class Interventions:
    """One run's value of every registered option, by name; immutable, compared and hashed by value."""

    def __init__(self, **given: Any) -> None:
        defaults = option_defaults()
        if unknown := sorted(set(given) - set(defaults)):
            raise TypeError(f"unknown intervention option(s) {unknown}; the registered ones are {sorted(defaults)}")
        self._values = {name: given.get(name, default) for name, default in defaults.items()}

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})  # absent while unpickling, before __dict__ is filled in
        if name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no option {name!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Interventions) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"Interventions({given})"

    def to_dict(self) -> dict[str, Any]:
        """The options away from their defaults, as a run's fingerprint covers them: registering another
        intervention then changes no run's fingerprint (a run without it resumes as before)."""
        defaults = option_defaults()
        return {name: value for name, value in self._values.items() if value != defaults[name]}

    def _given(self) -> list[Intervention]:
        return [intervention for intervention in registered() if intervention.given(self._values)]

    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        """Everything wrong with these options, one message each, without computing anything on the model.

        Their syntax always; with the `model` (None: it did not load) also the layers, heads, tokens and RoPE
        they name; with `bos_at_0` (None: not known) whether a BOS stands at position 0 where one is needed.
        """
        return [problem for item in registered() for problem in item.problems(self._values, model, bos_at_0)]

    @property
    def is_empty(self) -> bool:
        return not self._given()

    def describe(self, sink_heads: SinkHeads | None = None) -> dict[str, Any]:
        """The applied interventions, as recorded in the manifest (defaults of unused options dropped), with the
        `sink_heads` an `auto` chose under the name of what was done to them."""
        described: dict[str, Any] = {}
        for intervention in self._given():
            described |= intervention.describe(self._values, sink_heads)
        return described

    @property
    def needs_sink_heads(self) -> bool:
        return any(intervention.needs_sink_heads(self._values) for intervention in self._given())

    def at_load(self) -> tuple[tuple[str, Any], ...]:
        """The options of the given interventions that change the model as it loads: what tells one loaded model
        of a spec from another."""
        return tuple(
            item
            for intervention in self._given()
            if intervention.at_load
            for item in intervention.describe(self._values, None).items()
        )

    def config_overrides(self, config: PretrainedConfig) -> dict[str, Any]:
        """What the load-time interventions change in the model's config."""
        overrides: dict[str, Any] = {}
        for intervention in self._given():
            overrides |= intervention.load_overrides(self._values, config)
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
            intervention.edit_attention(self._values, edits, sink_heads, model, tokenizer)
        return edits

    @contextmanager
    def applied(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, bos_at_0: bool
    ) -> Iterator[None]:
        """Install the forward-hook interventions for the duration of the block."""
        with ExitStack() as stack:
            for intervention in self._given():
                stack.enter_context(intervention.hooks(self._values, model, tokenizer, bos_at_0))
            yield
