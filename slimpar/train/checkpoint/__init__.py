"""Checkpoints: DCP save and load (``dcp``), what a checkpoint holds (``layout``), SDP and pipeline full-name state
(``sdp``, ``pipeline``), manifests and safe loading (``manifest``, ``safe_dcp``), the exported model (``export``) and
``--model.init_from`` (``init_from``). Knows nothing of the strategies, the trainer or the launcher."""

__all__ = ["dcp", "export", "folders", "init_from", "layout", "manifest", "pipeline", "safe_dcp", "sdp", "sdp_pieces"]
