"""Optimizers: SPEL on Stiefel parameters beside AdamW on the rest (``spel``), and the choice among torch's
AdamW implementations (``adamw``)."""

__all__ = ["adamw", "spel"]
