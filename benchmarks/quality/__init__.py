"""``slimpar bench quality``: the quality harness (``harness``), its rows and sweeps (``rows``), the trends over
length and width (``trends``), the report (``report``) and plots (``plots``)."""

__all__ = ["harness", "plots", "report", "rows", "trends"]
