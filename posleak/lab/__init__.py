"""The lab: small decoders trained from scratch with controlled position encodings, masks and normalisations.

The lab model family itself (its config, `LabSpec`, and the model) lives in `posleak.models.lab`; here are the
trainer, the synthetic tasks, trials, the variant comparison and sweeps."""
