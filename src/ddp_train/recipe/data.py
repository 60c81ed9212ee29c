"""The data path: CIFAR-100 read into uint8 tensors on the training device, and this rank's
augmented, normalized training batches cut from them.

Reading: torchvision's on-disk format, checked. The pickles already store images channel-planar
(N x 3072 = N,3,32,32), so no per-image decode or transpose is needed. Training never downloads:
see download.py.

Augmentation (training set only, never the test set): random crop with 4-pixel zero padding plus
horizontal flip, the Olivia guide's transforms, done as one gather per batch on the batch's device
instead of per-image PIL work in DataLoader workers (the guide's bottleneck).

Batches: each epoch's shuffle (the same on every rank) and each step's slice of it, augmented with
a seed taken from the step's position, so a resumed run replays them; and the run's steps, which
the training set and the batch make (plan_steps).
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from ddp_train.config import TrainConfig
from ddp_train.distributed import DistEnv, agree_or_raise, barrier
from ddp_train.errors import TrainError
from ddp_train.layout import NUM_CLASSES, OFFICIAL_MD5, has_dataset, split_path
from ddp_train.synthetic import write_dataset

SYNTHETIC_DIRNAME = "synthetic-data"
IMAGE_SHAPE = (3, 32, 32)
# Per-channel mean and std of the CIFAR-100 training set (0..1 scale).
MEAN = (0.5071, 0.4865, 0.4409)
STD = (0.2673, 0.2564, 0.2762)


@dataclass(frozen=True)
class Split:
    images: torch.Tensor  # uint8, N x 3 x 32 x 32
    labels: torch.Tensor  # int64, N

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def head(self, n: int) -> "Split":
        return self if n <= 0 or n >= len(self) else Split(self.images[:n], self.labels[:n])

    def to(self, device: torch.device) -> "Split":
        return Split(self.images.to(device), self.labels.to(device))


class _CifarUnpickler(pickle.Unpickler):
    """Only what a CIFAR pickle holds (dicts, lists, numpy arrays): a pickle can run code."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor"),
        ("__builtin__", "object"), ("builtins", "object"),
        ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name}")
        return super().find_class(module, name)


def _unpickle(raw: bytes) -> dict:
    # latin1 reads the official Python 2 pickles; keys come back as str.
    return _CifarUnpickler(io.BytesIO(raw), encoding="latin1").load()


def load_split(data_dir: str | Path, name: str, verify: bool) -> Split:
    path = split_path(data_dir, name)
    if not path.is_file():
        raise TrainError(
            f"CIFAR-100 not found: no {path} (looked in --data-dir {data_dir}); run `make data` "
            f"or `ddp-train --download --data-dir {data_dir}` on a login node with internet access")
    raw = path.read_bytes()
    if verify and hashlib.md5(raw).hexdigest() != OFFICIAL_MD5[name]:
        raise TrainError(
            f"{path} does not match the official CIFAR-100 checksum: re-fetch it with `make data`, "
            f"or pass --allow-unverified-data for files you generated yourself")
    broken = f"{path} is not a readable CIFAR-100 pickle"
    fix = f"delete {path.parent} and re-fetch it with `make data`"
    try:
        entry = _unpickle(raw)
        data = np.asarray(entry["data"], dtype=np.uint8)
        labels = np.asarray(entry["fine_labels"], dtype=np.int64)
    except Exception as exc:  # truncated, wrong format, missing keys: all the same fix
        raise TrainError(f"{broken} ({type(exc).__name__}: {exc}); {fix}") from None
    n = labels.shape[0]
    if data.shape != (n, 3 * 32 * 32) or n == 0:
        raise TrainError(f"{broken} (data shape {data.shape} for {n} labels); {fix}")
    if labels.min() < 0 or labels.max() >= NUM_CLASSES:
        raise TrainError(f"{broken} (labels outside 0..{NUM_CLASSES - 1}); {fix}")
    images = torch.from_numpy(data).view(n, *IMAGE_SHAPE)
    return Split(images, torch.from_numpy(labels))


def load_cifar100(data_dir: str | Path, verify: bool) -> tuple[Split, Split]:
    return load_split(data_dir, "train", verify), load_split(data_dir, "test", verify)


@dataclass(frozen=True)
class RunData:
    """The run's data on the device: both splits, this rank's training batches and a note to print."""
    train_set: Split
    test_set: Split
    batches: "TrainBatches"
    steps: "Steps"
    note: str  # about a generated or a limited dataset; "" for the whole real one
    generated_in: str = ""  # where --demo generated its dataset, for want of CIFAR-100; "" for the real one


def prepare(config: TrainConfig, dist_env: DistEnv, device: torch.device) -> RunData:
    """Load (or, for --demo without real data, generate) the dataset onto `device`, with a note
    to print about it, and cut this rank's batches and the run's steps from it; every rank agrees on
    errors. config.batch_size is the resolved one (resolve.for_device)."""
    is_main = dist_env.is_main
    data_dir, verify, note, generated_in = Path(config.data_dir), not config.allow_unverified_data, "", ""
    if config.demo and not has_dataset(data_dir):
        data_dir, verify = Path(config.run_dir) / SYNTHETIC_DIRNAME, False
        generated_in = str(data_dir)
        n_train, n_test = config.limit_train or 4000, config.limit_test or 1000
        if is_main and not has_dataset(data_dir):
            write_dataset(data_dir, train=n_train, test=n_test, seed=config.seed)
        barrier()
        note = (f"No CIFAR-100 in {config.data_dir}: using a generated CIFAR-format dataset "
                f"({n_train} train, {n_test} test images) in {data_dir}; run `make data` for the real one")
    error: Optional[Exception] = None
    train_set = test_set = None
    try:
        train_set, test_set = load_cifar100(data_dir, verify)
        train_set, test_set = train_set.head(config.limit_train), test_set.head(config.limit_test)
        if len(train_set) < config.batch_size:
            raise TrainError(f"--batch-size {config.batch_size} is larger than the training set "
                             f"({len(train_set)} images): pass a smaller batch")
    except TrainError as exc:
        error = exc
    agree_or_raise(error, device)
    assert train_set is not None and test_set is not None
    if config.limit_train or config.limit_test:
        note = note or (f"Using the first {len(train_set)} training and {len(test_set)} "
                        f"test images of {data_dir}")
    train_set, test_set = train_set.to(device), test_set.to(device)
    batches = TrainBatches(train_set, config.batch_size, config.seed, dist_env.rank, dist_env.world_size)
    steps = plan_steps(len(train_set), config.batch_size, dist_env.world_size, config.epochs, config.warmup_epochs)
    return RunData(train_set, test_set, batches, steps, note, generated_in)


def memory_format_for(device: torch.device) -> torch.memory_format:
    """channels_last feeds GPU tensor cores; on CPU it measured slower for narrow models (docs)."""
    return torch.channels_last if device.type == "cuda" else torch.contiguous_format


@functools.lru_cache(maxsize=None)
def normalize_constants(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) built once per device and dtype: building them from Python lists every step is
    a blocking host-to-device copy (about 14% of an eager b256 step on an H100, docs/benchmarks.md)."""
    scale = torch.tensor([1 / (255 * s) for s in STD], dtype=dtype).view(1, 3, 1, 1)
    shift = torch.tensor([-m / s for m, s in zip(MEAN, STD)], dtype=dtype).view(1, 3, 1, 1)
    return scale.to(device), shift.to(device)


def normalize(images_uint8: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 N,3,H,W -> normalised float on the images' device, in the device's memory format."""
    device = images_uint8.device
    scale, shift = normalize_constants(device, dtype)
    x = images_uint8.to(dtype).contiguous(memory_format=memory_format_for(device))
    return torch.addcmul(shift, x, scale)


# -- Augmentation, on whole batches on their device --

def random_crop_flip(images: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """images: B,C,H,W (any dtype). Same result as torchvision RandomCrop(pad) + RandomHorizontalFlip."""
    b, c, h, w = images.shape
    device = images.device
    padded = F.pad(images, (pad, pad, pad, pad))
    top = torch.randint(0, 2 * pad + 1, (b, 1), device=device, generator=generator)
    left = torch.randint(0, 2 * pad + 1, (b, 1), device=device, generator=generator)
    flip = torch.rand((b, 1), device=device, generator=generator) < 0.5
    rows = top + torch.arange(h, device=device)
    cols = left + torch.arange(w, device=device)
    cols = torch.where(flip, cols.flip(1), cols)  # reading columns backwards is the flip
    batch_index = torch.arange(b, device=device).view(b, 1, 1, 1)
    channel_index = torch.arange(c, device=device).view(1, c, 1, 1)
    return padded[batch_index, channel_index, rows.view(b, 1, h, 1), cols.view(b, 1, 1, w)]


# -- This rank's training batches --

CROP_PADDING = 4


def step_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    """Augmentation randomness is a function of the position, so a resumed run replays it."""
    prime = 1_000_003
    return (((seed * prime + epoch) * prime + step) * prime + rank) % (2**63)


def batch_per_rank(batch_size: int, world_size: int) -> int:
    """Each rank's share of the global --batch-size (resolve.check_world makes it divide evenly)."""
    return batch_size // world_size


# -- The run's steps --

@dataclass(frozen=True)
class Steps:
    """How many optimizer steps an epoch and the run take, and each rank's share of a batch."""
    per_epoch: int
    total: int
    warmup: int
    batch_per_rank: int


def plan_steps(train_images: int, batch_size: int, world_size: int, epochs: int,
               warmup_epochs: float) -> Steps:
    """The last partial batch is dropped, so every rank takes the same number of steps."""
    per_epoch = train_images // batch_size
    return Steps(per_epoch, per_epoch * epochs, round(warmup_epochs * per_epoch),
                 batch_per_rank(batch_size, world_size))


def epoch_permutation(n: int, seed: int, epoch: int, device: torch.device) -> torch.Tensor:
    """The same shuffle on every rank (a CPU generator: identical on any device)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).to(device)


class TrainBatches:
    """Rank r takes the r-th slice of every global batch; augmentation runs on the batch's device."""

    def __init__(self, train_set: Split, batch_size: int, seed: int, rank: int, world_size: int):
        self.images, self.labels = train_set.images, train_set.labels
        self.batch_size, self.seed, self.rank = batch_size, seed, rank
        self.per_rank = batch_per_rank(batch_size, world_size)
        self.generator = torch.Generator(device=train_set.images.device)

    def permutation(self, epoch: int) -> torch.Tensor:
        return epoch_permutation(len(self.labels), self.seed, epoch, self.images.device)

    def batch(self, perm: torch.Tensor, epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = step * self.batch_size + self.rank * self.per_rank
        idx = perm[start:start + self.per_rank]
        self.generator.manual_seed(step_seed(self.seed, epoch, step, self.rank))
        return normalize(random_crop_flip(self.images[idx], CROP_PADDING, self.generator)), self.labels[idx]
