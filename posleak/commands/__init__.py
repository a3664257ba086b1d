"""The commands `analyze`, `intervene` and `inspect`: thin orchestrators over the one pipeline (posleak.pipeline)."""
