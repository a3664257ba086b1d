"""The claims of the reproduction, one package each (c1 … c6: the claim in claim.py, its options in options.py
where it has any), the registry of them in claim order (registry.py) and the plans that give each its options
(plans.py: QUICK and FULL). A package's own __init__ imports nothing, so that a plan's options are read without the
claims' imports (torch, pandas), as `posleak paper --help` does.
"""
