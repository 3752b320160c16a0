"""A run's lifecycle: the launcher and its workers (``launcher``, ``worker``, ``worker_entry``, ``local_rdzv``),
what a worker knows of its job (``context``, ``elastic``), failures a restart would repeat (``failure``, ``oom``),
stop signals and a launcher's death (``preempt``, ``parent``), and the run folder (``run_lock``, ``rerun``,
``run_files``)."""

__all__ = ["context", "elastic", "failure", "launcher", "local_rdzv", "oom", "parent", "preempt", "rerun", "run_files",
           "run_lock", "worker", "worker_entry"]
