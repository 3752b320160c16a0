"""Image loaders (Fashion-MNIST idx, CIFAR pickles, scikit-learn digits) and ImageData's batching."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from slimpar.data.errors import DataUnavailable
from slimpar.data.images import (
    ImageData,
    accuracy,
    channel_stats,
    load_cifar,
    load_digits_images,
    load_fashion_mnist,
)


@pytest.fixture(scope="module")
def fashion() -> ImageData:
    return ImageData("fashion_mnist", seed=3)


def _write_cifar(root: Path, which: str, per_file: int, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Write tiny batches in the official python-pickle layout; return the (images, labels) per split."""
    rng = np.random.default_rng(seed)
    if which == "cifar10":
        folder, splits, key = (
            root / "cifar-10-batches-py",
            {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]},
            b"labels",
        )
    else:
        folder, splits, key = (
            root / "cifar-100-python",
            {"train": ["train"], "test": ["test"]},
            b"fine_labels",
        )
    folder.mkdir(parents=True)
    expected = {}
    for split, files in splits.items():
        xs, ys = [], []
        for name in files:
            data = rng.integers(0, 256, size=(per_file, 3072), dtype=np.uint8)
            labels = rng.integers(0, 10 if which == "cifar10" else 100, size=per_file).tolist()
            batch = {b"batch_label": name.encode(), b"data": data, key: labels}
            if which == "cifar100":
                batch[b"coarse_labels"] = [y // 5 for y in labels]
            with open(folder / name, "wb") as f:
                pickle.dump(batch, f)
            xs.append(data.reshape(-1, 3, 32, 32))
            ys.append(np.array(labels, dtype=np.int64))
        expected[split] = (np.concatenate(xs), np.concatenate(ys))
    return expected


def test_fashion_mnist_full_and_balanced() -> None:
    for split, n in (("train", 60_000), ("test", 10_000)):
        x, y = load_fashion_mnist(split)
        assert x.shape == (n, 1, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int64
        assert np.array_equal(np.bincount(y), np.full(10, n // 10))
        assert x.max() == 255 and x.min() == 0


def test_fashion_mnist_root_override_and_missing(tmp_path: Path) -> None:
    images = np.arange(2 * 28 * 28, dtype=np.int64).reshape(2, 28, 28).astype(np.uint8)
    header = (2051).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (2, 28, 28))
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + images.tobytes()))
    labels_header = (2049).to_bytes(4, "big") + (2).to_bytes(4, "big")
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels_header + bytes([7, 3])))
    x, y = load_fashion_mnist("test", root=str(tmp_path))
    assert np.array_equal(x[:, 0], images) and y.tolist() == [7, 3]
    with pytest.raises(DataUnavailable, match="apt-get install dataset-fashion-mnist.*--data.image_dir"):
        load_fashion_mnist("train", root=str(tmp_path))


@pytest.mark.parametrize("which", ["cifar10", "cifar100"])
def test_cifar_parser_round_trips(tmp_path: Path, which: str) -> None:
    expected = _write_cifar(tmp_path, which, per_file=6)
    sub = "cifar-10-batches-py" if which == "cifar10" else "cifar-100-python"
    for split in ("train", "test"):
        for root in (tmp_path, tmp_path / sub):  # the parent folder or the extracted folder itself
            x, y = load_cifar(str(root), which, split)
            assert x.dtype == np.uint8 and x.shape[1:] == (3, 32, 32) and y.dtype == np.int64
            assert np.array_equal(x, expected[split][0]) and np.array_equal(y, expected[split][1])
    assert len(load_cifar(str(tmp_path), which, "train")[1]) == (30 if which == "cifar10" else 6)


def test_cifar_missing_files_name_the_fix(tmp_path: Path) -> None:
    _write_cifar(tmp_path, "cifar10", per_file=2)
    (tmp_path / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(DataUnavailable, match="data_batch_4.*--data.image_dir"):
        load_cifar(str(tmp_path), "cifar10", "train")
    with pytest.raises(DataUnavailable, match="--data.image_dir"):
        load_cifar("", "cifar100", "test")


def test_digits_split_and_scale() -> None:
    from sklearn.datasets import load_digits

    x_train, y_train = load_digits_images("train")
    x_test, y_test = load_digits_images("test")
    assert x_train.shape == (1500, 1, 8, 8) and x_test.shape == (297, 1, 8, 8) and x_train.dtype == np.uint8
    ref = load_digits()
    assert np.array_equal(y_test, ref.target[-297:]) and set(y_train.tolist()) == set(range(10))
    assert np.array_equal(x_test[:, 0] == 255, ref.images[-297:] == 16) and x_train.max() == 255


def test_channel_stats_match_numpy() -> None:
    x = np.random.default_rng(0).integers(0, 256, size=(50, 3, 4, 4), dtype=np.uint8)
    mean, std = channel_stats(x)
    f = x.astype(np.float64) / 255
    np.testing.assert_allclose(mean, f.mean(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(std, f.std(axis=(0, 2, 3)), rtol=1e-6)


def test_fashion_image_data_shapes_and_normalisation(fashion: ImageData) -> None:
    assert (fashion.channels, fashion.size, fashion.num_classes) == (1, 28, 10)
    x, y = fashion.train_batch(step=0, rank=0, world=1, global_batch=512)
    assert x.shape == (512, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    val = fashion.val_batches(batch_size=2000, max_batches=0)["test"]
    all_x = torch.cat([b[0] for b in val])
    assert abs(all_x.mean().item()) < 0.05 and abs(all_x.std().item() - 1) < 0.05  # train stats fit test


@pytest.mark.parametrize("world", [2, 4])
def test_train_batch_world_size_property(fashion: ImageData, world: int) -> None:
    for step in (0, 7):
        x, y = fashion.train_batch(step, 0, 1, 64)
        parts = [fashion.train_batch(step, r, world, 64) for r in range(world)]
        assert all(p[0].shape[0] == 64 // world for p in parts)
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)


def test_train_batch_deterministic_and_step_dependent(tmp_path: Path) -> None:
    _write_cifar(tmp_path, "cifar10", per_file=20)
    a = ImageData("cifar10", image_dir=str(tmp_path), seed=5)
    b = ImageData("cifar10", image_dir=str(tmp_path), seed=5)
    assert (a.channels, a.size, a.crop_pad) == (3, 32, 4)
    for step in (0, 3, 11):  # 100 images, batch 16: step 6 crosses the first epoch boundary
        xa, ya = a.train_batch(step, 1, 2, 16)
        xb, yb = b.train_batch(step, 1, 2, 16)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(a.train_batch(0, 0, 1, 16)[0], a.train_batch(1, 0, 1, 16)[0])
    other = ImageData("cifar10", image_dir=str(tmp_path), seed=6)
    assert not torch.equal(a.train_batch(0, 0, 1, 16)[0], other.train_batch(0, 0, 1, 16)[0])
    x6, _ = a.train_batch(6, 0, 1, 16)
    assert torch.equal(torch.cat([a.train_batch(6, r, 4, 16)[0] for r in range(4)]), x6)
    with pytest.raises(ValueError, match="split evenly"):
        a.train_batch(0, 0, 3, 16)


def _to_uint8(data: ImageData, x: torch.Tensor) -> torch.Tensor:
    return torch.round((x * data.std + data.mean) * 255).to(torch.uint8)


def test_one_epoch_visits_every_training_image_once() -> None:
    data = ImageData("digits", augment=False, seed=1)
    seen = torch.cat([_to_uint8(data, data.train_batch(s, 0, 1, 100)[0]) for s in range(15)])  # 1500 images
    rows = lambda t: sorted(bytes(r) for r in t.flatten(1).numpy())  # noqa: E731
    assert rows(seen) == rows(data.train_x)
    first, second = data.train_batch(0, 0, 1, 100)[1], data.train_batch(15, 0, 1, 100)[1]
    assert not torch.equal(first, second)  # every epoch has its own order


def _matching_crops(orig: torch.Tensor, aug: torch.Tensor, pad: int) -> set[tuple[int, int, bool]]:
    """All (dy, dx, flipped) whose crop of the zero-padded ``orig`` (C, H, W) equals ``aug``."""
    size = orig.shape[-1]
    padded = torch.nn.functional.pad(orig, (pad, pad, pad, pad))
    found = set()
    for dy in range(2 * pad + 1):
        for dx in range(2 * pad + 1):
            crop = padded[:, dy : dy + size, dx : dx + size]
            found |= {(dy, dx, f) for f, c in ((False, crop), (True, crop.flip(-1))) if torch.equal(c, aug)}
    return found


def _unaugmented(data: ImageData, step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    augment, data.augment = data.augment, False
    try:
        return data.train_batch(step, 0, 1, batch)
    finally:
        data.augment = augment


@pytest.mark.parametrize("image_set", ["digits", "fashion_mnist"])
def test_augmentation_is_crop_and_flip(fashion: ImageData, image_set: str) -> None:
    data = fashion if image_set == "fashion_mnist" else ImageData("digits", seed=3)
    assert data.crop_pad == (2 if image_set == "fashion_mnist" else 1)
    x_aug, y_aug = data.train_batch(2, 0, 1, 32)
    x_plain, y_plain = _unaugmented(data, 2, 32)
    assert torch.equal(y_aug, y_plain) and not torch.equal(x_aug, x_plain)
    orig, moved = _to_uint8(data, x_plain).float(), _to_uint8(data, x_aug).float()
    matches = [_matching_crops(o, m, data.crop_pad) for o, m in zip(orig, moved, strict=True)]
    assert all(matches)
    flipped = [any(f for _, _, f in m) and not any(not f for _, _, f in m) for m in matches]
    assert any(flipped) == (image_set == "fashion_mnist")  # digits are never mirrored


def test_val_batches_cover_test_split_in_order() -> None:
    data = ImageData("digits", seed=0)
    batches = data.val_batches(batch_size=64, max_batches=0)["test"]
    assert [len(b[1]) for b in batches] == [64] * 4 + [41]
    assert torch.equal(torch.cat([b[1] for b in batches]), data.test_y)
    assert torch.equal(_to_uint8(data, torch.cat([b[0] for b in batches])), data.test_x)
    capped = data.val_batches(batch_size=64, max_batches=2)["test"]
    assert len(capped) == 2 and torch.equal(capped[1][0], batches[1][0])


def test_accuracy() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, -1.0], [0.0, 5.0]])
    assert accuracy(logits, torch.tensor([0, 1, 1, 0])) == 0.5
