"""`--rope-scaling KIND:K` (docs/method.md §9): the model loaded with its RoPE scaled (posleak.interventions.rope)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posleak.interventions.base import Intervention, Option, Values
from posleak.interventions.rope import ROPE_KINDS, parse_rope_scaling, scaled_rope_parameters
from posleak.validate import Problems

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from posleak.models.load import LoadedModel


class RopeScaling(Intervention):
    name = "rope_scaling"
    options = (Option("rope_scaling", metavar="|".join(f"{kind}:K" for kind in ROPE_KINDS)),)
    at_load = True

    def problems(self, values: Values, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        found = Problems()
        with found.collecting():
            if values["rope_scaling"] is not None:
                parse_rope_scaling(values["rope_scaling"])
                # refuses a model without plain RoPE; one loaded with the scaling was checked as it loaded
                if model is not None and not model.overrides:
                    self.load_overrides(values, model.model.config)
        return found.found

    def load_overrides(self, values: Values, config: PretrainedConfig) -> dict[str, Any]:
        return {"rope_parameters": scaled_rope_parameters(config, values["rope_scaling"])}
