"""Start-up checks for inputs that are valid values but cannot run here (issue 22, item 5).

Each one used to end in a traceback or a silent surprise after processes had started; now each is a
ConfigError (exit 2) before anything is written:

- a backend the machine lacks (NCCL without CUDA);
- a folder that cannot be written: a path under a regular file, a read-only file system or directory, an
  empty ``--out``, a symbolic link to nowhere. Writability is probed by creating and removing a temporary file
  in the nearest existing folder, because ``os.access`` says yes to root even on a read-only mount;
- a run whose memory floor exceeds the machine (:mod:`slimpar.train.validate.memory_floor`): a huge batch,
  vocabulary, model or worker count shows up here instead of in an allocation that fails minutes later.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from slimpar.config import Config, ConfigError
from slimpar.train.validate.memory_floor import check_memory_floor
from slimpar.train.validate.processes import runs_in_process

__all__ = ["check_backend", "check_memory_floor", "check_writable", "runs_in_process"]


def check_backend(cfg: Config) -> None:
    """NCCL runs on GPUs only; a CPU run or a torch without NCCL cannot use it. A pipeline's stages on GPUs over
    gloo cannot send: gloo's point-to-point takes host tensors only."""
    from slimpar.train.modes import mode_of

    p = cfg.parallel
    mode_of(cfg).check_backend(cfg)  # a pipeline's stages on GPUs over gloo
    if p.backend != "nccl":
        return
    if p.device != "cuda":
        raise ConfigError("parallel.backend = 'nccl' runs on GPUs, and this run's device is the CPU (parallel.device "
                          "cpu, or auto on a machine without a GPU): use --parallel.backend gloo (or auto), or "
                          "--parallel.device cuda on a GPU machine")
    import torch.distributed as dist

    if not dist.is_nccl_available() and not runs_in_process(cfg):  # one process makes no group: it needs no NCCL
        raise ConfigError("parallel.backend = 'nccl': this torch build has no NCCL; use --parallel.backend gloo")


def check_writable(path: str | Path, what: str) -> None:
    """Raise ConfigError unless ``path`` is, or can be created as, a folder this process can write to."""
    if str(path).strip() == "":
        raise ConfigError(f"{what} is empty; name a folder (e.g. runs/my-run)")
    path = Path(path).expanduser()
    if path.is_symlink() and not path.exists():  # mkdir would fail on the link itself ("File exists")
        raise ConfigError(f"{what} = {str(path)!r} is a symbolic link to {os.readlink(path)!r}, which does not "
                          "exist; create that folder, remove the link, or give another folder")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"{what} = {str(path)!r} lies under {str(probe)!r}, which is a file, not a folder; "
                          "choose another path")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ConfigError(f"{what} = {str(path)!r} cannot be written: {str(probe)!r} refuses new files "
                          f"({e.strerror or e}); choose a writable folder") from None
