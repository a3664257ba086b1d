"""The registry of the reproduction's claims, in claim order: one line per claim, each a package of its own.

Adding a claim is one package (its `ClaimModule`, requests, options and criterion) and one line here.
"""

from __future__ import annotations

from posleak.experiments.paper.claim import ClaimModule
from posleak.experiments.paper.claims.c1.claim import C1
from posleak.experiments.paper.claims.c2.claim import C2
from posleak.experiments.paper.claims.c3.claim import C3
from posleak.experiments.paper.claims.c4.claim import C4
from posleak.experiments.paper.claims.c5.claim import C5
from posleak.experiments.paper.claims.c6.claim import C6

CLAIMS: tuple[type[ClaimModule], ...] = (C1, C2, C3, C4, C5, C6)
