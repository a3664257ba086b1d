"""The lab: small decoders trained from scratch with controlled position encodings, masks and normalisations.

Importing this package registers the lab model (`model_type` "posleak_lab") with transformers' AutoConfig
and AutoModelForCausalLM. The comparison and sweeps, which pull in the analysis and reports, live in
`posleak.lab.compare` and `posleak.lab.sweep` and are imported from there.
"""

from posleak.lab.config import LabConfig, LabSpec
from posleak.lab.model import LabForCausalLM, build_lab_model, load_lab_model
from posleak.lab.trainer import TrainConfig, TrainResult, train

__all__ = [
    "LabConfig",
    "LabForCausalLM",
    "LabSpec",
    "TrainConfig",
    "TrainResult",
    "build_lab_model",
    "load_lab_model",
    "train",
]
