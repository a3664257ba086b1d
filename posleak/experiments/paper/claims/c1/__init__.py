"""C1: RoPE-trained models show absolute position in their attention patterns (claim.py: the claim; options.py:
its options in a plan)."""
