"""C4: both components appear in every architecture, in a different balance (claim.py: the claim; lab.py: its
controlled lab line; window.py: its window line; options.py: its options in a plan)."""
