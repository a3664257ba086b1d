"""C6: attention sinks pass forward a deterministic fingerprint of the token at position 0 (claim.py: the claim;
probe.py: its identity probe; options.py: its options in a plan)."""
