"""Start-up checks, run before any process or group exists: ``checks.validate`` is the entry point; ``sdp``,
``pipeline`` and ``limits`` hold the mode-specific rules, ``ranges`` the allowed interval of each numeric field."""

__all__ = ["checks", "device", "limits", "memory_floor", "pipeline", "processes", "ranges", "sdp"]
