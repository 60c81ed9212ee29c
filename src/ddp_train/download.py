"""`ddp-train --download`: fetch CIFAR-100 once, on a login node, verified and atomic.

Plain urllib + tarfile instead of torchvision's downloader: no torch import, and the
archive is checked before anything lands in --data-dir, so a broken fetch never
leaves a half-written dataset that compute nodes then trip over.
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Mapping

from ddp_contract import DATASET_DIRNAME, missing_dataset_files

from ddp_train.layout import OFFICIAL_MD5, file_md5, has_dataset
from ddp_train.errors import TrainError

ARCHIVE_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
ARCHIVE_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"


def refuse_inside_job(env: Mapping[str, str]) -> None:
    """Several ranks downloading into one directory corrupts it (the seed does this)."""
    raw = env.get("WORLD_SIZE", "1") or "1"
    try:
        world_size = int(raw)
    except ValueError:
        raise TrainError(f"WORLD_SIZE={raw!r} is not an integer: unset it for --download") from None
    if world_size > 1:
        raise TrainError(
            "--download runs once, on a login node, not inside a distributed job: "
            "run `make data` (or `ddp-train --download --data-dir DIR`) before submitting")


def download_cifar100(data_dir: str | Path, url: str = ARCHIVE_URL, archive_md5: str = ARCHIVE_MD5) -> Path:
    data_dir = Path(data_dir)
    target = data_dir / DATASET_DIRNAME
    if has_dataset(data_dir) and all(
            file_md5(target / name) == md5 for name, md5 in OFFICIAL_MD5.items()):
        print(f"CIFAR-100 already present and verified in {target}")
        return target
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrainError(f"cannot create --data-dir {data_dir} ({exc.strerror}): "
                         f"pass a directory you can write") from None
    with tempfile.TemporaryDirectory(prefix=".cifar-download-", dir=data_dir) as tmp:
        archive = Path(tmp) / "cifar-100-python.tar.gz"
        print(f"Downloading {url} ...", file=sys.stderr)
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(archive, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
        except OSError as exc:
            raise TrainError(f"could not download {url} ({exc}); check the network "
                             f"(compute nodes are often offline: run this on a login node)") from None
        got = file_md5(archive)
        if got != archive_md5:
            raise TrainError(f"downloaded archive has md5 {got}, expected {archive_md5}: "
                             f"the download is corrupt, run `make data` again")
        extracted = Path(tmp) / "extracted"
        with tarfile.open(archive, "r:gz") as tar:
            # The "data" filter refuses absolute paths, links out of the tree and devices.
            tar.extractall(extracted, filter="data")
        missing = missing_dataset_files(str(extracted))
        if missing:
            raise TrainError(f"{url} did not contain {DATASET_DIRNAME}/{', '.join(missing)}")
        if target.exists():  # move the old copy aside; the temporary directory removes it
            os.replace(target, Path(tmp) / "previous")
        os.replace(extracted / DATASET_DIRNAME, target)  # same filesystem: atomic
    print(f"CIFAR-100 ready in {target}")
    return target
