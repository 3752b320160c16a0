"""Near the edge of the machine's memory, the analytic floor (slimpar.train.validate.memory_floor) refined by the
FakeTensorMode prediction of ``slimpar plan --memory`` (slimpar.train.memory.predict), before any worker starts.

The floor counts what a step cannot do without; a step allocates more on top (AdamW's and clipping's temporaries,
activations). Predicting costs seconds (about 7 s for one rank of any size here, most of it fixed), so it runs only
where the floor already takes :data:`PREDICT_ABOVE` of the memory, and for one rank: the heaviest on this machine.
Its predicted peak over its floor scales the floor of every rank here; a sum over the memory is refused (exit 2).
"""

from __future__ import annotations

from slimpar.config import Config, ConfigError
from slimpar.data.vocab import config_vocab_size
from slimpar.train.modes import mode_of
from slimpar.utils import fmt_bytes

PREDICT_ABOVE = 0.5  # predict when the floor takes at least half of the memory


def check_predicted_floor(cfg: Config) -> None:
    """Raise ConfigError where the predicted peak of this machine's workers exceeds its memory."""
    from slimpar.train.validate.limits import runs_in_process
    from slimpar.train.validate.memory_floor import (
        PROCESS_BYTES,
        fitting_settings,
        local_ranks,
        machine_bytes,
        need_bytes,
        rank_floors,
    )

    total = machine_bytes(cfg)
    if total is None or mode_of(cfg).memory_budget(cfg):  # a budget is predicted anyway
        return
    vocab = config_vocab_size(cfg) if cfg.data.kind == "text" else None  # from the config: no data is read
    need, local = need_bytes(cfg, vocab)
    if need < PREDICT_ABOVE * total:
        return
    floors = rank_floors(cfg, vocab)
    rank = max((r for r in local_ranks(cfg, runs_in_process(cfg)) if r < len(floors)), key=floors.__getitem__)
    try:
        from slimpar.train.memory.predict import predict_memory

        peak = predict_memory(cfg, [rank], vocab)[0]["peak_live"] + PROCESS_BYTES
    except Exception:  # a layout the prediction does not cover: the analytic floor (passed) stands
        return
    predicted = int(need * max(1.0, peak / floors[rank]))
    if predicted > total:
        fits = fitting_settings(cfg, vocab, int(total * floors[rank] / peak))
        fix = f"Settings that fit: {', '.join(fits)}" if fits else "Use a machine with more memory, or more machines"
        raise ConfigError(
            f"this run's predicted peak is {fmt_bytes(predicted)} of memory on this machine, which has "
            f"{fmt_bytes(total)}: {len(local)} worker(s) here; `slimpar plan --memory` predicts {fmt_bytes(peak)} "
            f"for rank {rank} (its floor: {fmt_bytes(floors[rank])}). {fix}")
