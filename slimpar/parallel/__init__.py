"""torch.distributed helpers shared by both methods: process groups (``groups``), the device a group communicates
on (``device``), exact memory and byte accounting (``comm``), bucketed data-parallel averaging (``average``),
replica fingerprints (``fingerprint``), host-sync and op counts (``syncs``), activation checkpointing, compilation
and mixed precision applied from outside a model (``ac``, ``compile``, ``precision``), where a process sits on its
machine (``placement``) and torch APIs newer than the floor (``compat``)."""

__all__ = ["ac", "average", "comm", "compat", "compile", "device", "fingerprint", "groups", "placement", "precision",
           "syncs"]
