"""Optimizers: SPEL on Stiefel parameters beside AdamW on the rest (``spel``), the choice among torch's
AdamW implementations (``adamw``), and the time a span of an optimizer's work took, read without making the host
wait for the device (``timing``)."""

__all__ = ["adamw", "spel", "timing"]
