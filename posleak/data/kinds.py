"""The allowed values of posleak's options, each spelled once: as a `Literal` type for the API and its tuple of
values for the command line's choices and the checks' messages. No torch here: the parsers import it.
"""

from __future__ import annotations

from typing import Literal, get_args

# What position 0 holds (posleak.data.batches): the BOS, never, or the BOS where the tokenizer adds one itself.
BosPolicy = Literal["auto", "on", "off"]
BOS_POLICIES: tuple[BosPolicy, ...] = get_args(BosPolicy)
# A token file's rows are taken as they are: its batch's BOS policy is this, not one of BOS_POLICIES.
Verbatim = Literal["verbatim"]
VERBATIM: Verbatim = "verbatim"

# The nulls of a batch (posleak.data.nulls, docs/method.md §14).
NullKind = Literal["shift", "shuffle"]
NULLS: tuple[NullKind, ...] = get_args(NullKind)

# The resolution of the profile and offset-map tables (posleak.measure.grid); magnitudes never depend on it.
GridKind = Literal["coarse", "exact"]
GRIDS: tuple[GridKind, ...] = get_args(GridKind)

# What replaces an ablated value at key 0 (--ablate-mode, posleak.interventions.key0_values).
AblateMode = Literal["zero", "mean"]
ABLATE_MODES: tuple[AblateMode, ...] = get_args(AblateMode)

# One part of a corpus's documents dealt in proportions (posleak.data.batches.part_documents): (index, shares),
# part `index` of parts whose numbers of documents are in the proportions `shares` ((0, (1, 1)): the first half).
Part = tuple[int, tuple[int, ...]]
