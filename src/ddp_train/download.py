"""`ddp-train --download`: fetch CIFAR-100 once, on a login node, verified and atomic.

The work is ddp_contract.download, which the login node's own python3 (3.6) also runs as
`python3 -m ddp_contract download DIR` (`make data`): no torch and no venv needed there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from ddp_contract import download as contract_download

from ddp_train.errors import TrainError
from ddp_train.exit_edge import world_size

ARCHIVE_URL = contract_download.ARCHIVE_URL
ARCHIVE_MD5 = contract_download.ARCHIVE_MD5


def refuse_inside_job(env: Mapping[str, str]) -> None:
    """Several ranks downloading into one directory corrupts it (the Olivia guide's train_ddp.py
    does this: every rank builds CIFAR100(download=True))."""
    size = world_size(env)
    if size is None:
        raise TrainError(f"WORLD_SIZE={env.get('WORLD_SIZE')!r} is not an integer: unset it for --download")
    if size > 1:
        raise TrainError(
            "--download runs once, on a login node, not inside a distributed job: "
            "run `make data` (or `ddp-train --download --data-dir DIR`) before submitting")


def download_cifar100(data_dir: str | Path, url: str = ARCHIVE_URL, archive_md5: str = ARCHIVE_MD5) -> Path:
    try:
        return Path(contract_download.download(str(data_dir), url, archive_md5))
    except contract_download.DownloadError as exc:
        raise TrainError(str(exc)) from None
