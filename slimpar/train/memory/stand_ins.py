"""Data stand-ins for the memory prediction (slimpar.train.memory.predict): batches of zeros with the
shapes, dtypes and storages of the real data's, so the prediction needs no data set on disk.

Images: :class:`~slimpar.data.images.ImageData` returns a float32 (b, C, H, W) batch, normalised (a
storage of its own, allocated during the step) and int64 labels (b,) gathered by index (another one);
the model is built from its ``channels``, ``size`` and ``num_classes``, which :data:`IMAGE_SHAPES` holds
for every bundled or supported set (a unit test checks them against the sets on this machine).
"""

from __future__ import annotations

import torch

from slimpar.config import Config
from slimpar.data.shares import batch_share

# image set -> (channels, side in pixels, classes), as ImageData reads them from the files
IMAGE_SHAPES: dict[str, tuple[int, int, int]] = {
    "fashion_mnist": (1, 28, 10),
    "digits": (1, 8, 10),
    "cifar10": (3, 32, 10),
    "cifar100": (3, 32, 100),
}


class FakeImages:
    """Stands in for ImageData: ``train_batch``'s share rule, zeros of the real shapes."""

    kind = "images"

    def __init__(self, image_set: str):
        if image_set not in IMAGE_SHAPES:
            raise ValueError(f"image_set {image_set!r} is not one of: {', '.join(IMAGE_SHAPES)}")
        self.image_set = image_set
        self.channels, self.size, self.num_classes = IMAGE_SHAPES[image_set]

    def train_batch(self, step: int, rank: int, world: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        b = len(batch_share(step, rank, world, global_batch))
        x = torch.zeros((b, self.channels, self.size, self.size))  # float32 (b, C, H, W), as _normalise leaves it
        return x, torch.zeros((b,), dtype=torch.long)  # (b,)


def fake_images(cfg: Config) -> FakeImages:
    """The stand-in for the run's ``data.image_set``."""
    return FakeImages(cfg.data.image_set)
