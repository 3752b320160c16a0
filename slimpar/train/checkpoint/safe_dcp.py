"""Loading DCP checkpoints without running code from them (docs/trust.md).

``torch.distributed.checkpoint`` unpickles twice on load, and both would run a crafted file's code:
``FileSystemReader.read_metadata`` reads ``.metadata`` with ``pickle.load``, and
``DefaultLoadPlanner.load_bytes`` reads every non-tensor entry of a shard (the optimizer's
``param_groups`` values) with ``torch.load(weights_only=False)``. :func:`dcp_load` replaces both:

- :class:`SafeFileSystemReader` reads ``.metadata`` with :class:`_MetadataUnpickler`, which resolves only
  :data:`METADATA_GLOBALS` (DCP's own metadata classes and the few torch and pathlib names they pickle)
  and any ``torch.<dtype>``. Every other global, e.g. ``os.system`` through ``__reduce__``, stops the
  load before it is looked up, with an :class:`UnsafeCheckpointError` naming the global and the file.
  The shard files the metadata points to must be plain names inside the checkpoint folder.
- :class:`SafeLoadPlanner` reads the non-tensor entries with ``torch.load(weights_only=True)``, torch's
  own restricted unpickler (tensors were already read that way by DCP).

The allow-list was derived by saving real checkpoints of every layout slimpar writes (single, DDP,
FSDP2/DTensor, SDP, SDP with holder_shard, virtual SDP, pipeline, virtual pipeline; LLaMA and ResNet)
and recording every global their ``.metadata`` refers to.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path, PurePosixPath

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from slimpar.config import ConfigError

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
METADATA_GLOBALS = frozenset({
    *((_DCP_METADATA, name) for name in ("Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata",
                                         "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
                                         "_MEM_FORMAT_ENCODING")),  # an Enum: called with its value, a lookup
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),  # storage_data's values: file, offset, length
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # how torch.strided pickles: a lookup by name among torch's layouts
    ("pathlib", "PosixPath"), ("pathlib._local", "PosixPath"),  # StorageMeta.checkpoint_id (3.13 moved it)
})


class UnsafeCheckpointError(ConfigError):
    """A checkpoint file that would run code or build unexpected objects on load; it was not loaded."""


def _refuse(path: Path, what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{path} {what}; it was refused, and nothing in it was run. A DCP checkpoint written by slimpar "
        "holds only DCP's metadata classes and plain data: this file was crafted or written by something else. "
        "Use another checkpoint or start over with a new --out (docs/trust.md)")


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` resolving only :data:`METADATA_GLOBALS` and ``torch.<dtype>``."""

    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) in METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and name.isidentifier() and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)  # the object itself: a dtype is not callable
        raise _refuse(self.path, f"refers to {module}.{name}, which is not one of DCP's metadata classes")


def read_dcp_metadata(path: str | Path) -> Metadata:
    """A DCP ``.metadata`` file read through :class:`_MetadataUnpickler` and checked: a ``Metadata`` whose
    shards are plain file names beside it. Raises :class:`UnsafeCheckpointError` (exit 2 from the CLI)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f, path).load()
    except UnsafeCheckpointError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            ImportError) as e:
        raise _refuse(path, f"is not DCP metadata ({type(e).__name__}: {e})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise _refuse(path, f"holds a {type(metadata).__name__}, not DCP's Metadata")
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or PurePosixPath(name).name != name or name in ("", ".", ".."):
            raise _refuse(path, f"points to shard {name!r}, which is not a file name inside its folder")
    return metadata


class SafeFileSystemReader(dcp.FileSystemReader):
    """``FileSystemReader`` whose ``read_metadata`` is :func:`read_dcp_metadata`. It takes no ``rank``
    keyword, so DCP does not fall back to a rank-local ``__{rank}.metadata`` (slimpar never writes one)."""

    refused: UnsafeCheckpointError | None = None  # the refusal, which DCP would wrap into its own exception

    def read_metadata(self) -> Metadata:
        try:
            metadata = read_dcp_metadata(Path(self._get_metadata_path()))
        except UnsafeCheckpointError as e:
            self.refused = e
            raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that reads non-tensor entries with ``torch.load(weights_only=True)``."""

    def __init__(self, path: Path, **kwargs):
        super().__init__(**kwargs)
        self.path = path

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:  # torch's message: a paragraph about weights_only around the cause
            cause = [line for line in str(e).splitlines() if "GLOBAL" in line or "nsupported" in line]
            raise _refuse(self.path, f"holds entry {read_item.dest_index.fqn!r}, which is not plain data "
                                     f"({cause[0].strip() if cause else 'refused by torch.load(weights_only=True)'})"
                          ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def dcp_load(state: dict, path: str | Path, group=None) -> None:
    """``dcp.load(state, checkpoint_id=path)`` through :class:`SafeFileSystemReader` and
    :class:`SafeLoadPlanner`; a refused file raises :class:`UnsafeCheckpointError`, not DCP's wrapper."""
    path = Path(path)
    reader = SafeFileSystemReader(path)
    try:
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(path), process_group=group)
    except CheckpointException as e:
        refused = [exc for exc, _ in e.failures.values() if isinstance(exc, UnsafeCheckpointError)]
        if reader.refused is not None or refused:
            raise reader.refused or refused[0] from None
        raise
