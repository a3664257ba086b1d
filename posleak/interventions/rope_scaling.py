"""`--rope-scaling KIND:K` (docs/method.md §9): the model loaded with its RoPE scaled (posleak.interventions.rope)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posleak.interventions.base import Intervention, setting
from posleak.interventions.rope import ROPE_KINDS, parse_rope_scaling, scaled_rope_parameters
from posleak.validate import Problems

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from posleak.models.load import LoadedModel


@dataclass(frozen=True)
class RopeScaling(Intervention):
    name = "rope_scaling"
    at_load = True

    scaling: str | None = setting("rope_scaling", metavar="|".join(f"{kind}:K" for kind in ROPE_KINDS))

    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        found = Problems()
        with found.collecting():
            if self.scaling is not None:
                parse_rope_scaling(self.scaling)
                # refuses a model without plain RoPE; one loaded with the scaling was checked as it loaded
                if model is not None and not model.overrides:
                    self.load_overrides(model.model.config)
        return found.found

    def load_overrides(self, config: PretrainedConfig) -> dict[str, Any]:
        assert self.scaling is not None  # installed only where given
        return {"rope_parameters": scaled_rope_parameters(config, self.scaling)}
