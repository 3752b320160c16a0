"""The protocol every parallel mode implements: what varies by ``parallel.mode`` outside the strategies.

A mode answers questions about a run config (never about a live process group): how its workers split the batch
and map to processes, what a checkpoint of it ties to its settings, what each rank holds at the least (given the
run's plan: :class:`slimpar.train.run_plan.RunPlan`), which settings make it fit a smaller machine, and which of its
own rules a config breaks. The start-up checks, the memory floor, the launcher, the checkpoint layout and
``slimpar plan`` ask the run's mode (:func:`slimpar.train.modes.mode_of`) instead of branching on its name.

The base class is the plain data-parallel answer (every rank holds the whole model); the modes override what
differs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slimpar.config import Config

Suggestion = tuple[str, "Config"]  # ("--sdp.keep 0.375", the config with it)


class Mode:
    """One ``parallel.mode``; subclasses override what differs from plain data parallelism."""

    name = ""
    section: str | None = None  # the config section only this mode reads ([sdp], [pipeline])
    tied: tuple[str, ...] = ()  # the section's fields that name or shape a checkpoint's tensors
    why_not_model_scope = ""  # why forward and loss cannot compile as one graph ("" where they can)

    def model_scope(self, cfg: Config) -> str:
        """Why ``train.compile_scope = model`` (forward and loss as one graph) cannot compile this run ("": it can)."""
        if not self.why_not_model_scope:
            return ""
        return model_scope_refusal(cfg, self.why_not_model_scope)

    def reads(self, cfg: Config) -> tuple[str, ...]:
        """The mode sections ([sdp], [pipeline]) this run reads, or single fields of one it reads in part
        (``"sdp.assignment"``): a command-line setting of any other is refused (validate.checks)."""
        return () if self.section is None else (self.section,)

    def kind(self, cfg: Config) -> str:
        """The strategy the config asks for (slimpar.train.strategies' builders are keyed by it)."""
        return self.name

    def data_parallel(self, cfg: Config) -> int:
        """Ranks that each read their own share of the global batch."""
        return cfg.parallel.workers

    def in_process(self, cfg: Config) -> bool:
        """Whether the launcher runs every worker in its own process (no process group)."""
        return False

    def needs_group(self, cfg: Config, world: int) -> bool:
        """Whether a worker of a ``world``-process job joins a process group."""
        return True

    def refits_accumulation(self, cfg: Config) -> bool:
        """Whether an elastic torchrun world refits ``train.grad_accum`` to keep the global batch."""
        return True

    def checkpoint_names(self, cfg: Config) -> str:
        """The names a checkpoint's tensors go by: "full" where they are the full model's."""
        return "full"

    def layout(self, cfg: Config) -> dict[str, Any]:
        """The section's settings a checkpoint ties to (:attr:`tied`; ``a.b``: field b of nested section a)."""
        if self.section is None:
            return {}
        from dataclasses import asdict

        values, out = asdict(getattr(cfg, self.section)), {}
        for name in self.tied:
            head, _, sub = name.partition(".")
            if sub:
                out.setdefault(head, {})[sub] = values[head][sub]
            else:
                out[name] = values[name]
        return out

    def keep(self, cfg: Config, layout: dict[str, Any], saved: dict[str, Any]) -> str:
        """Set in ``cfg`` what a resumed run keeps from its checkpoint (``layout``: its layout.json; ``saved``: what
        its tensors say, e.g. ``{"r": 14}``) where the config leaves it automatic; a note saying so, or ""."""
        return ""

    def layout_text(self, layout: dict[str, Any]) -> str:
        """A checkpoint's layout (:meth:`layout` within ``layout.json``) in words, for a refusal to load it."""
        return f"{self.name} ({layout.get('workers')} workers)"

    def state_bytes(self, run, total: int) -> list[int]:
        """Each rank's fp32 parameters, gradients and AdamW moments (16 bytes a parameter it owns)."""
        return [4 * total] * run.cfg.parallel.workers

    def holds_logits(self, cfg: Config, rank: int) -> bool:
        """Whether ``rank`` computes the loss (holds a micro-batch's logits and their gradient)."""
        return True

    def held(self, cfg: Config) -> str:
        """What a rank owns, in words, for the memory floor's message."""
        return "every parameter"

    def worker_step(self, cfg: Config) -> int:
        """The granularity of ``parallel.workers`` (a pipeline's stages, SDP's FSDP2 shards)."""
        return 1

    def fewer_bytes(self, cfg: Config) -> list[Suggestion]:
        """This mode's own settings that hold less per rank, from the least change."""
        return []

    def check(self, cfg: Config) -> None:
        """Raise ConfigError for this mode's own rules (the section's, in slimpar.train.validate)."""

    def check_backend(self, cfg: Config) -> None:
        """Raise ConfigError where the resolved device and backend cannot carry this mode's traffic."""

    def describe(self, cfg: Config) -> tuple[str, int]:
        """(the mode in words, sequences per worker) for ``slimpar plan --memory``'s workload line."""
        return self.name, cfg.train.batch_size // max(cfg.parallel.workers, 1)

    def flops_share(self, cfg: Config) -> bool:
        """Whether a rank runs the full model's FLOPs per token (MFU is reported only then)."""
        return True

    def heaviest_ranks(self, run) -> list[int]:
        """The ranks whose memory can be the largest (``slimpar plan --fit`` predicts these)."""
        return [0]

    def gathers_parameters(self, cfg: Config) -> bool:
        """Whether ranks gather sharded parameters before computing (FSDP2's 2-D layout)."""
        return False

    def memory_budget(self, cfg: Config) -> str:
        """The per-worker memory budgets this run asks the launcher to fit ("" for none)."""
        return ""


def model_scope_refusal(cfg: Config, why: str) -> str:
    return (f"train.compile_scope = 'model' (forward and loss as one graph) does not fit parallel.mode = "
            f"{cfg.parallel.mode!r}: {why}; use --train.compile_scope loss (each block and the loss compiled) or "
            "blocks")


def with_parallel(cfg: Config, **changes) -> Config:
    return replace(cfg, parallel=replace(cfg.parallel, **changes))
