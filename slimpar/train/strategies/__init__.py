"""The trainer's adapters: one strategy per parallel mode (single process, DDP, FSDP2, SDP, pipeline).

Each wraps a library (torch DDP/FSDP2, :mod:`slimpar.sdp`, :mod:`slimpar.pipeline`) behind the small
interface :class:`slimpar.train.strategies.base.Strategy` that the training loop talks to.
"""
