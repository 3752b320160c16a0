"""Real image data read from local files (never downloaded), with deterministic batching and augmentation.

Sources: Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package (idx files), CIFAR-10/100 from
the standard python-pickle batches in a folder the user supplies (read by a restricted unpickler that
allows only numpy's array reconstruction: a batch file cannot run code), and scikit-learn's bundled 8x8
digits. :class:`ImageData` serves training batches whose content is a pure function of
(seed, step): the global batch of a step is a slice of a per-epoch permutation seeded by
(seed, epoch), rank r takes the r-th contiguous slice, and each image's random crop/flip comes from a
generator seeded by (seed, step, position in the global batch). One worker with batch B therefore
sees exactly the concatenation of what W workers with B/W each see.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from slimpar.data.errors import DataUnavailable
from slimpar.data.shares import batch_share

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FIX = (
    "install it with `sudo apt-get install dataset-fashion-mnist`, or pass a folder holding "
    "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
    "t10k-labels-idx1-ubyte.gz as --data.image_dir"
)
IMAGE_SETS = ("fashion_mnist", "cifar10", "cifar100", "digits")
DIGITS_TEST = 297  # the last 297 of scikit-learn's 1,797 digits are the test split
_MASK64 = (1 << 64) - 1
_TAG_ORDER, _TAG_AUGMENT = 1, 2  # separate random streams for data order and augmentation


def _check_split(split: str) -> None:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")


def _read_idx(path: Path, magic: int) -> np.ndarray:
    """Parse a gzipped idx file (big-endian magic, dimension sizes, then uint8 data)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    found, ndim = int.from_bytes(raw[:4], "big"), raw[3]
    if found != magic:
        raise ValueError(f"{path} is not an idx file of the expected kind (magic {found}, want {magic})")
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_fashion_mnist(split: str, root: str = FASHION_MNIST_DIR) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST ``split`` from the idx ``.gz`` files in ``root``: uint8 (N, 1, 28, 28), int64 (N,)."""
    _check_split(split)
    prefix = "train" if split == "train" else "t10k"
    folder = Path(root or FASHION_MNIST_DIR)
    images_path = folder / f"{prefix}-images-idx3-ubyte.gz"
    labels_path = folder / f"{prefix}-labels-idx1-ubyte.gz"
    missing = [p.name for p in (images_path, labels_path) if not p.is_file()]
    if missing:
        raise DataUnavailable(
            f"Fashion-MNIST not found ({', '.join(missing)} missing in {folder}); {FASHION_MNIST_FIX}"
        )
    images = _read_idx(images_path, 2051)  # (N, 28, 28)
    labels = _read_idx(labels_path, 2049)  # (N,)
    return images[:, None].copy(), labels.astype(np.int64)


def _cifar_layout(which: str, split: str) -> tuple[str, list[str], bytes]:
    """(sub-folder name, batch files, label key) of the official python release."""
    if which == "cifar10":
        files = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
        return "cifar-10-batches-py", files, b"labels"
    if which == "cifar100":
        return "cifar-100-python", [split], b"fine_labels"
    raise ValueError(f"which must be 'cifar10' or 'cifar100', got {which!r}")


# The only globals a CIFAR python batch (a pickled dict of bytes, lists and numpy arrays, written by
# Python 2's or Python 3's pickle with any numpy) refers to. Anything else, e.g. os.system through
# __reduce__, is refused before it is called.
_CIFAR_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("_codecs", "encode"),  # how protocol 2 writes bytes from Python 3 (harmless: str -> bytes)
}


def _plain_dtype(*args, **kwargs) -> np.dtype:
    """``numpy.dtype`` for the unpickler, refusing object dtypes (their payload would be more pickles)."""
    dt = np.dtype(*args, **kwargs)
    if dt.hasobject:
        raise pickle.UnpicklingError(f"object dtype {dt} refused")
    return dt


class _CifarUnpickler(pickle.Unpickler):
    """Reads CIFAR's python batches without running arbitrary code: only numpy's array reconstruction
    (with plain dtypes) may be called; every other global in the stream is an UnpicklingError."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _CIFAR_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
        if name == "dtype":
            return _plain_dtype
        return super().find_class(module, name)


def read_cifar_batch(path: Path) -> dict:
    """One python batch file as a dict (bytes keys), through the restricted :class:`_CifarUnpickler`."""
    try:
        with open(path, "rb") as f:
            batch = _CifarUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as e:
        raise DataUnavailable(f"{path} is not a CIFAR python batch ({type(e).__name__}: {e}); it was not loaded. "
                              "Point --data.image_dir at the official cifar-10-batches-py / cifar-100-python "
                              "files") from None
    if not isinstance(batch, dict) or b"data" not in batch:
        raise DataUnavailable(f"{path} is not a CIFAR python batch (no b'data' entry); point --data.image_dir "
                              "at the official files")
    return batch


def load_cifar(root: str, which: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 or CIFAR-100 (fine labels) ``split`` from the python-pickle batches: uint8 (N, 3, 32, 32),
    int64 (N,). ``root`` is the extracted ``cifar-10-batches-py`` / ``cifar-100-python`` folder or its parent.
    """
    _check_split(split)
    sub, files, label_key = _cifar_layout(which, split)
    if not root:
        raise DataUnavailable(
            f"{which} is not bundled; pass the folder holding its python batches ({sub}) as --data.image_dir"
        )
    folder = Path(root) / sub if (Path(root) / sub).is_dir() else Path(root)
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        raise DataUnavailable(
            f"{which} {split} batches {', '.join(missing)} not found in {folder}; pass the "
            f"extracted {sub} folder (or its parent) as --data.image_dir"
        )
    images, labels = [], []
    for name in files:
        batch = read_cifar_batch(folder / name)
        if label_key not in batch:
            raise DataUnavailable(f"{folder / name} has no {label_key!r} entry; is it a {which} batch?")
        images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels.append(np.asarray(batch[label_key], dtype=np.int64))
    return np.concatenate(images), np.concatenate(labels)


def load_digits_images(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (values 0..16) scaled to uint8 0..255: (N, 1, 8, 8), int64 (N,).
    The last :data:`DIGITS_TEST` images are the test split, the first 1,500 the training split."""
    _check_split(split)
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)[:, None]  # (1797, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    part = slice(None, -DIGITS_TEST) if split == "train" else slice(-DIGITS_TEST, None)
    return images[part].copy(), labels[part].copy()


def load_image_set(image_set: str, split: str, image_dir: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Dispatch on ``image_set`` (one of :data:`IMAGE_SETS`); ``image_dir`` overrides the data folder."""
    if image_set == "fashion_mnist":
        return load_fashion_mnist(split, image_dir or FASHION_MNIST_DIR)
    if image_set in ("cifar10", "cifar100"):
        return load_cifar(image_dir, image_set, split)
    if image_set == "digits":
        return load_digits_images(split)
    raise ValueError(f"image_set {image_set!r} is not one of: {', '.join(IMAGE_SETS)}")


def _mix(*values: int) -> int:
    """Hash integers into a 63-bit seed with splitmix64 steps (deterministic across processes)."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = ((h ^ (v & _MASK64)) + 0x9E3779B97F4A7C15) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h >> 1


def channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact per-channel mean and std of uint8 (N, C, H, W) images on the 0..1 scale, from histograms."""
    values = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for c in range(images.shape[1]):
        counts = np.bincount(images[:, c].ravel(), minlength=256).astype(np.float64)
        mean = (counts * values).sum() / counts.sum()
        var = (counts * (values - mean) ** 2).sum() / counts.sum()
        means.append(mean)
        stds.append(max(np.sqrt(var), 1e-8))
    return np.array(means, dtype=np.float32), np.array(stds, dtype=np.float32)


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows of ``logits`` (B, K) whose arg-max equals ``y`` (B,)."""
    return (logits.argmax(dim=-1) == y).float().mean().item()


class ImageData:
    """Training and test images with deterministic, world-size-independent batching.

    ``train_batch(step, rank, world, B)`` returns rank ``rank``'s contiguous share of the global batch
    of ``step``; the global batch is positions [step*B, (step+1)*B) of an endless stream made of one
    permutation of the training split per epoch, seeded by (seed, epoch).
    """

    def __init__(self, image_set: str, image_dir: str = "", augment: bool = True, seed: int = 0):
        self.image_set, self.augment, self.seed = image_set, augment, seed
        train_x, train_y = load_image_set(image_set, "train", image_dir)
        test_x, test_y = load_image_set(image_set, "test", image_dir)
        # uint8 images (N, C, H, W) and int64 labels (N,); normalised per batch, so memory stays 1 byte/pixel
        self.train_x, self.train_y = torch.from_numpy(train_x), torch.from_numpy(train_y)
        self.test_x, self.test_y = torch.from_numpy(test_x), torch.from_numpy(test_y)
        mean, std = channel_stats(train_x)
        self.mean = torch.from_numpy(mean).view(1, -1, 1, 1)  # (1, C, 1, 1)
        self.std = torch.from_numpy(std).view(1, -1, 1, 1)
        self.channels, self.size = int(train_x.shape[1]), int(train_x.shape[-1])
        self.num_classes = int(max(train_y.max(), test_y.max())) + 1
        # Standard CIFAR recipe: 4 px padding at 32 px, scaled down for smaller images.
        self.crop_pad = 4 if self.size >= 32 else 2 if self.size >= 16 else 1
        # Mirrored digits are not digits any more; clothes and CIFAR objects stay what they are.
        self.flip = image_set != "digits"
        self._orders: dict[int, torch.Tensor] = {}

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            if len(self._orders) >= 2:  # a cache: with B <= N a step touches at most two epochs
                self._orders.pop(min(self._orders))
            g = torch.Generator().manual_seed(_mix(self.seed, _TAG_ORDER, epoch))
            self._orders[epoch] = torch.randperm(len(self.train_y), generator=g)
        return self._orders[epoch]

    def _indices(self, positions: torch.Tensor) -> torch.Tensor:
        """Training-set indices at stream ``positions`` (epoch = position // N, then that epoch's order)."""
        n = len(self.train_y)
        epochs, offsets = positions // n, positions % n
        out = torch.empty_like(positions)
        for e in torch.unique(epochs).tolist():
            sel = epochs == e
            out[sel] = self._epoch_order(e)[offsets[sel]]
        return out

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:  # uint8 (B, C, H, W) -> float32
        return (x.float() / 255.0 - self.mean) / self.std

    def _augment(self, x: torch.Tensor, step: int, first: int) -> torch.Tensor:
        """Random crop of the zero-padded image and random horizontal flip, per image, seeded by
        (seed, step, position in the global batch) so the result does not depend on the rank layout."""
        p, size = self.crop_pad, self.size
        padded = F.pad(x, (p, p, p, p))  # (b, C, H+2p, W+2p); zero = black, as in the usual recipe
        out = torch.empty_like(x)
        for i in range(x.shape[0]):
            g = torch.Generator().manual_seed(_mix(self.seed, _TAG_AUGMENT, step, first + i))
            dy, dx = torch.randint(0, 2 * p + 1, (2,), generator=g).tolist()
            flip = bool(torch.randint(0, 2, (1,), generator=g).item())
            crop = padded[i, :, dy : dy + size, dx : dx + size]
            out[i] = crop.flip(-1) if self.flip and flip else crop
        return out

    def train_batch(self, step: int, rank: int, world: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's contiguous slice of the global batch of ``step``: float32 (b, C, H, W), int64 (b,)."""
        share = batch_share(step, rank, world, global_batch)  # ValueError unless 0 <= rank < world | global_batch
        first = share.start - step * global_batch
        positions = torch.arange(share.start, share.stop)
        idx = self._indices(positions)
        x, y = self.train_x[idx], self.train_y[idx]  # uint8 (b, C, H, W), (b,)
        if self.augment:
            x = self._augment(x, step, first)
        return self._normalise(x), y

    def val_batches(self, batch_size: int, max_batches: int) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The test split in order, normalised, unaugmented: {"test": [(x (b, C, H, W), y (b,)), ...]}.
        At most ``max_batches`` batches (all of them when ``max_batches`` <= 0); the last may be short."""
        n = len(self.test_y)
        count = -(-n // batch_size)
        if max_batches > 0:
            count = min(count, max_batches)
        batches = []
        for i in range(count):
            part = slice(i * batch_size, min((i + 1) * batch_size, n))
            batches.append((self._normalise(self.test_x[part]), self.test_y[part].clone()))
        return {"test": batches}
