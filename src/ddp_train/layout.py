"""CIFAR-100's on-disk layout (torchvision's `cifar-100-python/`): paths and checksums.

No torch and no numpy here: the downloader and the data generator share it. The folder's
name and files come from ddp_contract, which the job scripts' dataset check also uses.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ddp_contract import DATASET_DIRNAME, missing_dataset_files
from ddp_contract.download import OFFICIAL_MD5  # noqa: F401  (torchvision's checksums, kept in one place)

NUM_CLASSES = 100


def split_path(data_dir: str | Path, name: str) -> Path:
    return Path(data_dir) / DATASET_DIRNAME / name


def has_dataset(data_dir: str | Path) -> bool:
    return not missing_dataset_files(str(data_dir))


def file_md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
