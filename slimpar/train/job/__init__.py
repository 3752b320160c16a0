"""What a worker knows of its job, below the trainer and the launcher alike: its place (``context``: rank, world,
device, run folder, process group), the elastic membership record and the samples a step trained on
(``elastic``), its stop signals (``preempt``), its launcher (``parent``: a death signal, the launcher's pid) and
the files a run folder keeps beside its metrics (``run_files``). The trainer uses these and never the launcher."""

__all__ = ["context", "elastic", "parent", "preempt", "run_files"]
