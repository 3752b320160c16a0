"""Pipeline configurations that cannot run are rejected at start-up with a message naming the fix,
and the torch 2.13 private API that CodecPipelineStage overrides is still there."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.distributed.pipelining import PipelineStage

from slimpar.config import ConfigError
from slimpar.pipeline.stage import CodecPipelineStage
from slimpar.train.validate.checks import load_run_config
from tests.helpers import TINY, standin_gpus

GOOD = ["--model.tie_embeddings", "false", "--parallel.mode", "pipeline", "--parallel.workers", "2",
        "--pipeline.stages", "2", "--pipeline.microbatches", "2"]

BAD = {
    "rank larger than d": (["--pipeline.codec", "mapl", "--pipeline.rank", "65"], "larger than the model width d = 64"),
    "more stages than blocks": (["--parallel.workers", "5", "--pipeline.stages", "5"],
                                "more than the model's 4 blocks"),
    "too many stages": (["--model.size", "small", "--parallel.workers", "9", "--pipeline.stages", "9"],
                        "between 2 and 8"),
    "one stage": (["--parallel.workers", "1", "--pipeline.stages", "1"], "between 2 and 8"),
    "workers not whole pipelines": (["--parallel.workers", "3"], "must be a multiple of pipeline.stages"),
    "codebook too large": (["--pipeline.codec", "mapl", "--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook",
                            "65537"], "between 2 and 65,536"),
    "rvq without projector": (["--pipeline.codec", "int8", "--pipeline.rvq.levels", "2"], "needs codec mapl, ssn"),
    "microbatches not dividing": (["--pipeline.microbatches", "3"], "must divide the per-replica batch"),
    "microbatches not dividing replica batch": (["--parallel.workers", "4", "--pipeline.microbatches", "8"],
                                                "8 / 2 replicas = 4"),
    "tied embeddings with ssn": (["--model.tie_embeddings", "true", "--pipeline.codec", "ssn"],
                                 "add --model.tie_embeddings false"),
    "anchors without projector": (["--pipeline.anchors", "factorized"], "needs a learned projector codec"),
    "anchors with ssn": (["--pipeline.codec", "ssn", "--pipeline.anchors", "full"], "own fixed token table"),
    "compression not dividing d": (["--pipeline.codec", "mapl", "--pipeline.compression", "3",
                                    "--pipeline.compression_of", "payload"],
                                   "does not divide d = 64"),
    "virtual with workers": (["--pipeline.virtual", "true"], "set --parallel.workers 1"),
    "1f1b too few microbatches": (["--parallel.workers", "4", "--pipeline.stages", "4", "--pipeline.microbatches",
                                   "2"], "needs pipeline.microbatches >= pipeline.stages"),
    "gradient accumulation": (["--train.grad_accum", "2"], "set --train.grad_accum 1"),
    "unknown codec": (["--pipeline.codec", "fp8"], "pipeline.codec = 'fp8' is not one of"),
    "not a llama": (["--model.arch", "resnet18", "--data.kind", "images"], "splits LLaMA models"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_pipeline_configs_are_rejected(case: str, monkeypatch) -> None:
    overrides, message = BAD[case]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)  # cuda configs get past the GPU count
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        load_run_config(TINY, GOOD + overrides)


def test_cuda_without_enough_gpus_is_rejected(monkeypatch) -> None:
    standin_gpus(monkeypatch, 1)
    with pytest.raises(ConfigError, match="runs 2 worker process.*one GPU each; it has 1 GPUs"):
        load_run_config(TINY, GOOD + ["--parallel.device", "cuda"])
    virtual = ["--parallel.workers", "1", "--pipeline.virtual", "true", "--parallel.device", "cuda"]
    cfg = load_run_config(TINY, GOOD + virtual)
    assert cfg.parallel.device == "cuda"  # a virtual pipeline needs one GPU


def test_good_configs_pass() -> None:
    load_run_config(TINY, GOOD)
    load_run_config(TINY, GOOD + ["--pipeline.codec", "mapl", "--pipeline.anchors", "factorized",
                              "--pipeline.rvq.levels", "2", "--pipeline.rvq.codebook", "65536",
                              "--pipeline.compression_of", "payload"])  # its codebooks alone exceed 1/4 of the total
    load_run_config(TINY, GOOD + ["--pipeline.codec", "mapl", "--pipeline.compression", "3"])  # total: no divisor
    cfg = load_run_config(TINY, GOOD + ["--parallel.workers", "1", "--pipeline.virtual", "true"])
    assert cfg.pipeline.virtual and cfg.parallel.workers == 1
    for stages in ("2", "3"):  # tied embeddings: stage 0 and the last stage keep one weight in sync
        cfg = load_run_config(TINY, GOOD + ["--model.tie_embeddings", "true", "--parallel.workers", stages,
                                            "--pipeline.stages", stages, "--pipeline.codec", "mapl",
                                            "--pipeline.schedule", "gpipe"])
        assert cfg.model.tie_embeddings


def test_overridden_torch_internals_still_exist() -> None:
    """CodecPipelineStage replaces these PipelineStage methods (torch 2.13); a rename must fail here."""
    expected = {
        "forward_one_chunk": ["self", "fwd_chunk_id", "args", "kwargs", "save_forward_output"],
        "get_fwd_send_ops": ["self", "fwd_chunk_id"],
        "get_fwd_recv_ops": ["self", "fwd_chunk_id"],
        "get_bwd_send_ops": ["self", "bwd_chunk_id"],
        "get_bwd_recv_ops": ["self", "bwd_chunk_id"],
        "_retrieve_recv_activations": ["self", "fwd_chunk_id"],
        "_retrieve_recv_grads": ["self", "bwd_chunk_id"],
        "_check_chunk_id": ["self", "chunk_id"],
    }
    for name, params in expected.items():
        base = getattr(PipelineStage, name)
        assert list(inspect.signature(base).parameters) == params, name
        assert getattr(CodecPipelineStage, name) is not base or name == "_check_chunk_id", name
    init = inspect.signature(PipelineStage.__init__).parameters
    assert {"input_args", "output_args", "group"} <= set(init)
    src = inspect.getsource(PipelineStage)
    base_src = inspect.getsource(PipelineStage.__mro__[1])
    for attr in ("self.bwd_cache", "self.args_recv_info", "self.fwd_cache"):
        assert attr in src or attr in base_src, attr
