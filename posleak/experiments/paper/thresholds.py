"""The thresholds that more than one claim judges by, each once, with why it is that number.

A claim's own thresholds stay in its package; a number that another claim borrows lives here, so that a change to
it is seen to move every claim that reads it.
"""

from __future__ import annotations

# nats: the least a log-attention magnitude must exceed to count as present. A log-attention term of 0.05 nats moves
# attention weights by about 5%. C1 and C2 judge their magnitudes by it, C4 its models' and its lab's (a line whose
# magnitude is not above it cannot test a lowering).
MIN_MAGNITUDE = 0.05

PAPER_BOS_REMOVED = 40.0  # the paper's "about 40%" of the early residual-stream component
BOS_TOLERANCE = 20.0  # points either side of the paper's figure that still count as meeting it
# %: the share of the early residual-stream component that the paper gives position 0's token, with its tolerance:
# C5 judges its BOS replacement against it, and C3 takes its low edge as the least share a head's clock carries
# (claims.c3.units.MIN_CLOCK_LOWERING: a fifth of the squared component is 10.6% of the magnitude).
BOS_BAND = (PAPER_BOS_REMOVED - BOS_TOLERANCE, PAPER_BOS_REMOVED + BOS_TOLERANCE)
