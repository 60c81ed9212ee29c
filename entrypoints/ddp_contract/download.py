"""CIFAR-100 onto a login node with nothing but its own python3 (3.6 on SLES 15): fetched,
checked against the published MD5, unpacked, and moved into place only when all of it is right.

`python3 -m ddp_contract download DATA_DIR` (what `make data` runs) and `ddp-train --download`
both end here. No torch: the dataset is a tarball and its checksum. Everything is written in a
temporary directory inside DATA_DIR and renamed into place last (same filesystem: atomic), so an
interrupted or corrupt download leaves nothing that looks like a dataset to the job scripts.
"""

import hashlib
import os
import sys
import tarfile
import tempfile
import urllib.request

from ddp_contract import DATASET_DIRNAME, missing_dataset_files

# The python version of CIFAR-100 and its MD5, as published with it
# (https://www.cs.toronto.edu/~kriz/cifar.html) and as torchvision's CIFAR100 pins them.
ARCHIVE_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
ARCHIVE_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"
# The extracted files' checksums, as torchvision's CIFAR100 lists them.
OFFICIAL_MD5 = {
    "train": "16019d7e3df5f24257cddd939b257f8d",
    "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    "meta": "7973b15100ade9c7d40fb424638fde48",
}
TIMEOUT_S = 60
CHUNK = 1 << 20


class DownloadError(Exception):
    """A download that did not produce the dataset: one line that says why and what to do."""


def file_md5(path: str) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def has_official_dataset(data_dir: str) -> bool:
    folder = os.path.join(data_dir, DATASET_DIRNAME)
    return not missing_dataset_files(data_dir) and all(
        file_md5(os.path.join(folder, name)) == md5 for name, md5 in OFFICIAL_MD5.items())


def fetch(url: str, path: str) -> None:
    """url into path; a transfer that ends before its Content-Length is an error, not a short file
    (http.client returns the bytes it got and no error when the server closes early)."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(path, "wb") as out:
            expected = response.headers.get("Content-Length")
            got = 0
            for chunk in iter(lambda: response.read(CHUNK), b""):
                out.write(chunk)
                got += len(chunk)
    except (OSError, ValueError) as exc:  # URLError, timeouts, resets; ValueError: a malformed URL
        raise DownloadError("could not download {} ({}); check the network (compute nodes are often "
                            "offline: run this on a login node)".format(url, exc))
    if expected is not None and expected.isdigit() and got != int(expected):
        raise DownloadError("the download of {} stopped after {} of {} bytes: run `make data` again"
                            .format(url, got, expected))


def safe_members(tar: tarfile.TarFile) -> list:
    """Regular files and directories inside the archive's own tree, nothing else (Python 3.6's
    tarfile has no extraction filter: no absolute paths, no '..', no links or devices)."""
    members = []
    for member in tar.getmembers():
        parts = member.name.replace("\\", "/").split("/")
        if member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir()):
            raise DownloadError("the archive holds {!r}, which is not a plain file inside it: "
                                "refusing to unpack it".format(member.name))
        members.append(member)
    return members


def unpack(archive: str, into: str) -> None:
    with tarfile.open(archive, "r:gz") as tar:
        members = safe_members(tar)
        # Where tarfile has filters (3.12, and 3.8.17+ backports), the "data" one too.
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(into, members=members, **extra)


def download(data_dir: str, url: str = ARCHIVE_URL, archive_md5: str = ARCHIVE_MD5,
             say=None) -> str:
    """CIFAR-100 into data_dir/cifar-100-python; returns that path. Raises DownloadError."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    target = os.path.join(data_dir, DATASET_DIRNAME)
    if has_official_dataset(data_dir):
        say("CIFAR-100 already present and verified in {}".format(target))
        return target
    try:
        os.makedirs(data_dir, exist_ok=True)
    except OSError as exc:
        raise DownloadError("cannot create {} ({}): pass a directory you can write"
                            .format(data_dir, exc.strerror))
    with tempfile.TemporaryDirectory(prefix=".cifar-download-", dir=data_dir) as tmp:
        archive = os.path.join(tmp, "cifar-100-python.tar.gz")
        say("Downloading {} ...".format(url))
        fetch(url, archive)
        got = file_md5(archive)
        if got != archive_md5:
            raise DownloadError("downloaded archive has md5 {}, expected {}: the download is corrupt, "
                                "run `make data` again".format(got, archive_md5))
        extracted = os.path.join(tmp, "extracted")
        unpack(archive, extracted)
        missing = missing_dataset_files(extracted)
        if missing:
            raise DownloadError("{} did not contain {}/{}".format(url, DATASET_DIRNAME, ", ".join(missing)))
        if os.path.exists(target):  # the old copy goes aside; the temporary directory removes it
            os.replace(target, os.path.join(tmp, "previous"))
        os.replace(os.path.join(extracted, DATASET_DIRNAME), target)
    say("CIFAR-100 ready in {}".format(target))
    return target


# A mirror of the archive, for machines without the internet (a site's own copy, a pod network that
# reaches only the cluster): the URL and, for another archive than the published one, its MD5.
MIRROR_URL_VAR, MIRROR_MD5_VAR = "DDP_CIFAR_URL", "DDP_CIFAR_MD5"


def main(args: list) -> int:
    """download DATA_DIR [--url URL] [--md5 MD5]; 0 when the dataset is in place, 1 when not.
    --url and --md5 default to $DDP_CIFAR_URL and $DDP_CIFAR_MD5, else the published archive's."""
    usage = "usage: python3 -m ddp_contract download DATA_DIR [--url URL] [--md5 MD5]"
    options = {"--url": os.environ.get(MIRROR_URL_VAR) or ARCHIVE_URL,
               "--md5": os.environ.get(MIRROR_MD5_VAR) or ARCHIVE_MD5}
    positional = []  # type: list
    rest = list(args)
    while rest:
        word = rest.pop(0)
        if word in options and rest:
            options[word] = rest.pop(0)
        elif word.startswith("-"):
            print(usage, file=sys.stderr)
            return 2
        else:
            positional.append(word)
    if len(positional) != 1:
        print(usage, file=sys.stderr)
        return 2
    try:
        download(positional[0], options["--url"], options["--md5"])
    except DownloadError as exc:
        print("ddp_contract download: error: {}".format(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the temporary directory is gone already: nothing half-written stays
        print("ddp_contract download: interrupted; nothing was written into {}".format(positional[0]),
              file=sys.stderr)
        return 130
    return 0

