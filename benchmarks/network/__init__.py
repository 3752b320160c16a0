"""Emulated networks for the benchmarks: throttled links between network namespaces (``links``, ``tcp_probe``),
two emulated nodes (``nodes``), the throttled-link rows of ``bench sdp`` / ``bench mapl`` (``throttled``) and
``bench wallclock`` (``wallclock``)."""

__all__ = ["links", "nodes", "tcp_probe", "throttled", "wallclock"]
