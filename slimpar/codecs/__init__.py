"""What crosses a pipeline boundary: projectors (``projector``, the Stiefel math in ``stiefel``), anchor
embeddings (``anchors``), residual vector quantization (``rvq``) and its codebook synchronisation
(``codebook_sync``), casts (``quant``) and bit packing (``packing``). Each module is imported where it is used."""

__all__ = ["anchors", "codebook_sync", "packing", "projector", "quant", "rvq", "stiefel"]
