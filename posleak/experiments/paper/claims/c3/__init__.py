"""C3: position 0 is a closed system; later queries read its trajectory through sink-reading heads (claim.py: the
claim; units.py: its units, their heads, runs and evidence; options.py: its options in a plan)."""
