"""CIFAR-100's on-disk layout (torchvision's `cifar-100-python/`): paths and checksums.

No torch and no numpy here: the downloader and the data generator share it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

DATASET_DIRNAME = "cifar-100-python"
# The official files' checksums, as torchvision's CIFAR100 lists them.
OFFICIAL_MD5 = {
    "train": "16019d7e3df5f24257cddd939b257f8d",
    "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    "meta": "7973b15100ade9c7d40fb424638fde48",
}
NUM_CLASSES = 100


def split_path(data_dir: str | Path, name: str) -> Path:
    return Path(data_dir) / DATASET_DIRNAME / name


def has_dataset(data_dir: str | Path) -> bool:
    return all(split_path(data_dir, n).is_file() for n in ("train", "test"))


def file_md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
