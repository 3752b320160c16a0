"""slimpar's methods where users already train (docs/integrations.md), each module importing its framework:

- ``hf``: ``SDPTrainer``, ``transformers.Trainer`` with SDP (needs ``slimpar[hf]``);
- ``lightning``: ``SDPStrategy``, PyTorch Lightning's DDP strategy with SDP (needs ``slimpar[lightning]``);
- ``common``: ``SDPArguments`` and ``wrap_model`` (an Accelerate loop, or any loop), and ``holder_sync`` for a
  torchtitan-style ``parallelize`` that cuts with ``apply_subnet`` and parallelizes the subnetwork itself;
- ``pipelining``: ``codec_stage``, MAPL codecs around a user's own ``torch.distributed.pipelining`` stages.

Nothing is imported here, so ``import slimpar.integrations`` needs none of the frameworks. The integrations use
the method libraries (``sdp``, ``pipeline``), never the trainer."""

__all__ = ["common", "hf", "lightning", "pipelining"]
