"""The trainer behind ``slimpar train``: building a run (``build``), the loop (``trainer``, ``step``, ``guard``,
``evaluate``), the strategies that wrap the libraries, and the rooms listed in docs/architecture.md."""

__all__ = ["build", "checkpoint", "evaluate", "guard", "job", "launch", "memory", "sinks", "step", "strategies",
           "trainer", "validate"]
