"""posleak's version, recorded in every manifest and report (the package root re-exports it)."""

__version__ = "0.1.0"
