"""A run's lifecycle: the launcher and its workers (``launcher``, ``worker``, ``worker_entry``, ``local_rdzv``),
failures a restart would repeat (``failure``, ``oom``) and the run folder (``run_lock``, ``rerun``). What a worker
knows of its job (its context, the elastic record, stop signals, its launcher) is ``slimpar.train.job``."""

__all__ = ["failure", "launcher", "local_rdzv", "oom", "rerun", "run_lock", "worker", "worker_entry"]
