"""C2: the causal mask makes the softmax denominator depend on the query position (claim.py: the claim, which
reads C1's nulls)."""
