"""One process, DDP and FSDP2: every rank runs the whole model (FSDP2 shards what it holds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slimpar.config import ConfigError
from slimpar.train.modes.base import Mode, Suggestion, with_parallel

if TYPE_CHECKING:
    from slimpar.config import Config


class Single(Mode):
    name = "single"

    def in_process(self, cfg: Config) -> bool:
        return True

    def needs_group(self, cfg: Config, world: int) -> bool:
        return world > 1

    def check(self, cfg: Config) -> None:
        if cfg.parallel.workers != 1:
            raise ConfigError("parallel.mode = 'single' runs one worker; set --parallel.mode ddp|fsdp|sdp for more")


class DDP(Mode):
    name = "ddp"
    why_not_model_scope = "DDP's forward is not traced by dynamo: the graph breaks there (twice per step)"

    def fewer_bytes(self, cfg: Config) -> list[Suggestion]:
        return [("--parallel.mode fsdp", with_parallel(cfg, mode="fsdp"))]


class FSDP(Mode):
    name = "fsdp"
    why_not_model_scope = "FSDP2's root hooks are not traced by dynamo: the graph breaks there"

    def state_bytes(self, run, total: int) -> list[int]:
        w = run.cfg.parallel.workers
        return [4 * total // w] * w

    def held(self, cfg: Config) -> str:
        return f"1/{cfg.parallel.workers} of the parameters (FSDP2 shards)"

    def gathers_parameters(self, cfg: Config) -> bool:
        return True
