"""C5: replacing the BOS embedding removes about 40% of the residual-stream component at early queries (claim.py:
the claim)."""
