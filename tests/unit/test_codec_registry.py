"""A codec registered from outside slimpar: a toy top-k sparsifier, declared in this file alone.

``TOPK`` keeps the k largest-magnitude numbers of every token and sends them as float32 values plus int16
positions; backward, the receiver does the same to the gradient. Its setting k is a typed field with a default,
given as ``--pipeline.codec_options k=8``, checked by the kind (1 <= k <= d). Registered, it trains in a
virtual pipeline through the real CLI, sends per step what a hand count says (tokens x k x (4 + 2) bytes each
way), resumes from a checkpoint to the bit, and its checkpoint is tied to its k. No file of slimpar names it.
The top-k snippet of docs/pipeline.md ("Adding a codec") runs as written and sends what its text says.
"""

from __future__ import annotations

import re
import runpy
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import Tensor

from slimpar.cli import main
from slimpar.config import ConfigError
from slimpar.pipeline.budget import steady_bytes
from slimpar.pipeline.codec_registry import CodecKind, register_codec, unregister_codec
from slimpar.pipeline.wire import Packet, WireSpec
from slimpar.train.build import build_data
from slimpar.train.strategies.pipeline_specs import codec_specs, step_shape
from slimpar.train.validate.checks import load_run_config
from tests.helpers import ROOT, TINY, VIRTUAL_PIPELINE, assert_same_run, losses, summary, train_virtual_pipeline

D, K = 64, 8  # the tiny LLaMA's width; entries kept per token
RUN = [*VIRTUAL_PIPELINE, "--pipeline.stages", "2", "--pipeline.microbatches", "2", "--pipeline.codec", "topk",
       "--pipeline.codec_options", f"k={K}"]


@dataclass(frozen=True)
class TopKSettings:
    k: int = 4  # numbers kept per token


def _check(s: TopKSettings, d: int) -> None:
    if not 1 <= s.k <= d:
        raise ValueError(f"k = {s.k} must be between 1 and d = {d}")


class TopKCast:
    """Forward: the top-k of x per token (straight-through); both ways k float32 values + k int16 positions."""

    def __init__(self, k: int, width: int):
        self.k, self.width = k, width

    def _sparse(self, x: Tensor) -> tuple[Tensor, Tensor]:
        idx = x.abs().topk(self.k, dim=-1).indices  # (mb, T, k)
        return x.gather(-1, idx).to(torch.float32), idx.to(torch.int16)

    def encode(self, x: Tensor) -> tuple[Tensor, list[Packet]]:
        values, idx = self._sparse(x.detach())
        kept = self.decode([values, idx]).to(x.dtype)
        return x + (kept - x).detach(), [Packet("payload", values), Packet("payload", idx)]

    def packets(self, g: Tensor) -> list[Packet]:
        return [Packet("payload", t) for t in self._sparse(g)]

    def specs(self, shape: tuple[int, int], width: int) -> list[WireSpec]:
        return [WireSpec("payload", (*shape, self.k), dtype) for dtype in (torch.float32, torch.int16)]

    def decode(self, tensors: list[Tensor]) -> Tensor:
        values, idx = tensors[0], tensors[1]
        out = torch.zeros(*values.shape[:-1], self.width, dtype=torch.float32, device=values.device)
        return out.scatter(-1, idx.to(torch.int64), values.to(torch.float32))


TOPK = CodecKind("topk", settings=TopKSettings, build_cast=lambda s, width: TopKCast(s.k, width), check=_check)


@pytest.fixture
def topk():
    register_codec(TOPK)
    yield TOPK
    unregister_codec("topk")


def test_the_cast_keeps_the_k_largest_magnitudes_and_rebuilds_them_bit_for_bit(topk) -> None:
    x = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(0), requires_grad=True)
    cast = topk.configured(TopKSettings(K), D).cast
    out, packets = cast.encode(x)
    rank = x.detach().abs().argsort(dim=-1, descending=True).argsort(dim=-1)  # 0 = the largest magnitude
    want = torch.where(rank < K, x.detach(), torch.zeros(()))  # an independent top-k: by sorting
    assert torch.equal(out.detach(), want) and torch.equal(cast.decode([p.tensor for p in packets]), want)
    out.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))  # straight-through
    assert [tuple(w.shape) for w in cast.specs((2, 3), D)] == [tuple(p.tensor.shape) for p in packets]
    assert topk.bytes_per_token(D, TopKSettings(K)) == {"fwd": K * 6, "bwd": K * 6}


def test_options_are_typed_defaulted_and_checked_by_the_kind(topk) -> None:
    cfg = load_run_config(TINY, [*RUN[:-2]])  # no options: the kind's default k
    assert codec_specs(cfg, D, 512)[0].settings == TopKSettings(4)
    cfg = load_run_config(TINY, RUN)
    assert codec_specs(cfg, D, 512)[0].settings == TopKSettings(K)
    with pytest.raises(ConfigError, match=r"codec 'topk' has no option 'kk' \(did you mean 'k'\?"):
        load_run_config(TINY, [*RUN[:-1], "kk=3"])
    with pytest.raises(ConfigError, match=f"k = 65 must be between 1 and d = {D}"):
        load_run_config(TINY, [*RUN[:-1], "k=65"])
    with pytest.raises(ConfigError, match="option k: expected int, got 'two'"):
        load_run_config(TINY, [*RUN[:-1], "k=two"])
    with pytest.raises(ConfigError, match="codec 'mapl' takes no codec options"):
        load_run_config(TINY, [*VIRTUAL_PIPELINE, "--pipeline.codec", "mapl", "--pipeline.codec_options", "k=3"])


def test_virtual_pipeline_sends_the_hand_counted_bytes(topk) -> None:
    cfg = load_run_config(TINY, RUN)
    strat = train_virtual_pipeline(cfg, build_data(cfg), steps=2)
    tokens = 8 * 64  # train.batch_size x data.seq_len, in 2 microbatches
    hand = tokens * K * (4 + 2)  # float32 value + int16 position per kept number
    assert dict(strat.counter.step) == {(0, "fwd", "payload"): hand, (0, "bwd", "payload"): hand}
    spec = codec_specs(cfg, D, 512)[0]
    assert steady_bytes(spec, step_shape(cfg)) == {"fwd": hand, "bwd": hand}  # the budget reads the declaration


def test_the_layout_records_the_resolved_settings_and_built_in_layouts_are_unchanged(topk) -> None:
    from slimpar.train.checkpoint.layout import checkpoint_layout

    def tied(*args: str) -> dict:
        return checkpoint_layout(load_run_config(TINY, list(args)))["pipeline"]

    assert tied(*RUN[:-1], " k = 8 ")["codec_options"] == tied(*RUN)["codec_options"] == {"k": 8}  # typed, by value
    assert tied(*RUN[:-2])["codec_options"] == {"k": 4}  # the default, spelled out
    assert "codec_options" not in tied(*VIRTUAL_PIPELINE, "--pipeline.codec", "mapl")  # as before codecs had settings


def _train(out: Path, *extra: str) -> int:
    return main(["train", "--config", str(TINY), "--out", str(out), "--data.ood", "none", "--train.steps", "3",
                 "--checkpoint.final", "false", *RUN, *extra])


def test_trains_resumes_exactly_and_ties_its_checkpoint_to_k(topk, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert _train(straight) == 0
    assert _train(split, "--train.stop_after", "1") == 0
    assert len(losses(split)) == 1
    assert _train(split, "--resume") == 0
    assert len(losses(split)) == 3
    assert_same_run(split, straight)  # losses, validation loss and every exported weight, to the bit
    hand = 8 * 64 * K * 6
    s = summary(straight)
    assert s["comm_bytes_per_step_fwd"] == s["comm_bytes_per_step_bwd"] == hand
    assert s["compression_ratio"] == pytest.approx(D * 4 / (K * 6))
    capsys.readouterr()
    # --allow-change lets a resume change a defining setting; the checkpoint's layout still refuses another k
    assert _train(split, "--resume", "--allow-change", "--pipeline.codec_options", "k=4", "--train.steps", "4") == 2
    assert "pipeline.codec_options.k: checkpoint 8, this run 4" in capsys.readouterr().err


def test_the_docs_snippet_registers_trains_and_sends_what_its_text_says(tmp_path, monkeypatch) -> None:
    doc = (ROOT / "docs" / "pipeline.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if b.startswith("# my_codec.py")]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_codec.py").write_text(code)
    try:
        runpy.run_path(str(tmp_path / "my_codec.py"), run_name="__main__")  # python my_codec.py, in this process
    finally:
        unregister_codec("topk")
    s = summary(tmp_path / "runs" / "topk")
    tokens, k, none = 8 * 64, 16, 8 * 64 * D * 4
    assert s["boundary_bytes_per_step_fwd"] == s["boundary_bytes_per_step_bwd"] == tokens * k * 6 == 49_152
    assert s["comm_bytes_per_step_none"] == none == 131_072 and 49_152 / none == 0.375
    assert "= 49,152 bytes each way, 0.375 of the uncompressed 131,072" in " ".join(doc.split())
