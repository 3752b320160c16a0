"""Start-up checks for inputs that are valid values but cannot run here (issue 22, item 5).

Each one used to end in a traceback or a silent surprise after processes had started; now each is a
ConfigError (exit 2) before anything is written:

- a backend the machine lacks (NCCL without CUDA);
- a folder that cannot be written: a path under a regular file, a read-only file system or directory, an
  empty ``--out``. Writability is probed by creating and removing a temporary file in the nearest existing
  folder, because ``os.access`` says yes to root even on a read-only mount;
- a run whose memory floor exceeds the machine: every worker holds at least its parameters, their
  gradients and AdamW's two moments (16 bytes a parameter in fp32; counted on a meta-device model, so a
  billion-row vocabulary costs nothing to count) plus one micro-batch's logits and their gradient. A huge
  batch, vocabulary or token id shows up here instead of in an allocation that fails minutes later.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from slimpar.config import Config, ConfigError
from slimpar.utils import fmt_bytes

STATE_BYTES_PER_PARAM = 16  # fp32 parameter + gradient + AdamW exp_avg + exp_avg_sq


def check_backend(cfg: Config) -> None:
    """NCCL runs on GPUs only; a CPU run or a torch without NCCL cannot use it."""
    p = cfg.parallel
    if p.backend != "nccl":
        return
    if p.device != "cuda":
        raise ConfigError("parallel.backend = 'nccl' needs --parallel.device cuda (NCCL runs on GPUs); on CPU use "
                          "--parallel.backend gloo (or auto)")
    import torch.distributed as dist

    if not dist.is_nccl_available():
        raise ConfigError("parallel.backend = 'nccl': this torch build has no NCCL; use --parallel.backend gloo")


def check_writable(path: str | Path, what: str) -> None:
    """Raise ConfigError unless ``path`` is, or can be created as, a folder this process can write to."""
    if str(path).strip() == "":
        raise ConfigError(f"{what} is empty; name a folder (e.g. runs/my-run)")
    path = Path(path).expanduser()
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


def check_memory_floor(cfg: Config, data_vocab: int | None = None) -> None:
    """Raise ConfigError when one worker's unavoidable bytes, times the workers on this machine, exceed it."""
    total = _machine_bytes(cfg)
    if total is None:
        return
    params = count_parameters(cfg, data_vocab)
    state = params * STATE_BYTES_PER_PARAM
    logits = _logits_bytes(cfg, data_vocab)
    local = _local_workers(cfg)
    if cfg.parallel.mode == "ddp":  # every worker holds everything
        need = (state + logits) * local
    elif local == 1 and not os.environ.get("LOCAL_WORLD_SIZE"):  # single, or every worker in this process
        need = state + logits
    else:  # FSDP2, SDP, pipelines: each parameter is held at least once in the job
        need = state * local // max(1, cfg.parallel.workers) + logits * local
    if need > total:
        raise ConfigError(
            f"this run needs at least {fmt_bytes(need)} of memory on this machine ({local} worker(s); the model's "
            f"{params:,} parameters with gradients and AdamW state take {fmt_bytes(state)}, one worker's "
            f"micro-batch logits {fmt_bytes(logits)}); this machine has {fmt_bytes(total)}. Lower "
            "--train.batch_size (or raise --train.grad_accum), --model.size or --model.vocab_size, or use more "
            "machines")


def count_parameters(cfg: Config, data_vocab: int | None = None) -> int:
    """The full model's parameter count, built on the meta device (allocates nothing)."""
    import torch

    from slimpar.train.build import build_model

    class _Vocab:  # build_model reads only vocab_size from the data
        vocab_size = data_vocab

    with torch.device("meta"):
        model = build_model(cfg, _Vocab() if data_vocab else None)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _logits_bytes(cfg: Config, data_vocab: int | None) -> int:
    """fp32 logits and their gradient for one worker's micro-batch (text); images: a negligible head."""
    if cfg.data.kind != "text":
        return 0
    from slimpar.train.build import llama_config

    vocab = llama_config(cfg, vocab_size=data_vocab).vocab_size
    per_worker = cfg.train.batch_size // max(1, _data_parallel(cfg) * cfg.train.grad_accum)
    return 2 * 4 * max(1, per_worker) * cfg.data.seq_len * vocab


def _data_parallel(cfg: Config) -> int:
    p = cfg.parallel
    if p.mode == "pipeline":
        return max(1, p.workers // max(cfg.pipeline.stages, 1))
    return 1 if cfg.sdp.virtual and p.mode == "sdp" else p.workers


def _local_workers(cfg: Config) -> int:
    """Processes that share this machine: torchrun's LOCAL_WORLD_SIZE, one for in-process runs, else all."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    return 1 if runs_in_process(cfg) else cfg.parallel.workers


def runs_in_process(cfg: Config) -> bool:
    """Whether slimpar's launcher runs every worker in its own process: single, virtual pipelines, virtual SDP."""
    p = cfg.parallel
    return p.mode == "single" or (p.mode == "pipeline" and cfg.pipeline.virtual) or (
        p.mode == "sdp" and cfg.sdp.virtual)


def _machine_bytes(cfg: Config) -> int | None:
    if cfg.parallel.device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory * _local_workers(cfg) if torch.cuda.is_available() \
            else None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
