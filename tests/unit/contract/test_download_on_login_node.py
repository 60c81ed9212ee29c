"""`make data` on a login node that has only its own python3 (3.6 on SLES 15): the standard-library
downloader fetches a real CIFAR-100-format tarball over HTTP, checks its MD5, and leaves nothing
that looks like a dataset after a corrupt or interrupted transfer.

The rules it encodes: the archive https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz and
its published MD5 eb9058c3a382ffc7106e4002c42a8d85 (https://www.cs.toronto.edu/~kriz/cifar.html;
torchvision's CIFAR100 pins the same), and http.client's documented leniency: a body cut short
before its Content-Length is returned without an error, so the length must be checked.
"""

from __future__ import annotations

import glob
import hashlib
import http.server
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from ddp_contract import DATASET_FILES, missing_dataset_files
from ddp_contract.download import ARCHIVE_MD5, DownloadError, unpack
from ddp_train.synthetic import write_dataset

REPO = Path(__file__).resolve().parents[3]
ARCHIVE = "cifar-100-python.tar.gz"


def python36() -> str | None:
    """SLES 15's interpreter version where this machine has one (pyenv's real binary)."""
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.6*/bin/python3.6")))
    return found[0] if found else None


PYTHON36 = python36()
INTERPRETERS = [
    pytest.param(sys.executable, id="this-python"),
    pytest.param(PYTHON36, id="python3.6", marks=pytest.mark.skipif(
        PYTHON36 is None, reason="no python3.6 here (pyenv install 3.6.15); vermin --target=3.6 still checks it")),
]


def make_archive(folder: Path) -> bytes:
    """A small tarball in the real format: cifar-100-python/{train,test,meta} as pickled dicts."""
    source = folder / "source"
    write_dataset(source, train=8, test=4)
    path = folder / ARCHIVE
    with tarfile.open(path, "w:gz") as tar:
        tar.add(source / "cifar-100-python", arcname="cifar-100-python")
    return path.read_bytes()


class Served(http.server.BaseHTTPRequestHandler):
    """/good: the tarball; /corrupt: one byte flipped; /cut: full Content-Length, half the body."""
    body = b""

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = self.body
        if self.path == "/corrupt/" + ARCHIVE:
            body = body[:100] + bytes([body[100] ^ 0xFF]) + body[101:]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if self.path == "/cut/" + ARCHIVE else body)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served")
    handler = type("Handler", (Served,), {"body": make_archive(folder)})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", hashlib.md5(handler.body).hexdigest()
    httpd.shutdown()


def run_download(python: str, data_dir: Path, *options: str, **env: str) -> subprocess.CompletedProcess:
    """As `make data` runs it: the checkout's entrypoints on PYTHONPATH, nothing else installed."""
    return subprocess.run([python, "-m", "ddp_contract", "download", str(data_dir), *options],
                          env={"PYTHONPATH": str(REPO / "entrypoints"), "PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, timeout=120)


def test_a_mirror_in_the_environment_stands_in_for_the_published_archive(server, tmp_path):
    # What runai/submit.sh --download's pod runs, where the pod network has no internet: the mirror
    # named by DDP_CIFAR_URL and DDP_CIFAR_MD5, still checked against that MD5.
    base, md5 = server
    result = run_download(sys.executable, tmp_path / "data", DDP_CIFAR_URL=f"{base}/good/{ARCHIVE}", DDP_CIFAR_MD5=md5)
    assert result.returncode == 0, result.stderr
    assert f"Downloading {base}/good/{ARCHIVE}" in result.stderr
    assert missing_dataset_files(str(tmp_path / "data")) == ()
    corrupt = run_download(sys.executable, tmp_path / "other", DDP_CIFAR_URL=f"{base}/corrupt/{ARCHIVE}",
                           DDP_CIFAR_MD5=md5)
    assert corrupt.returncode == 1 and "downloaded archive has md5" in corrupt.stderr


@pytest.mark.parametrize("python", INTERPRETERS)
def test_download_verifies_unpacks_and_leaves_only_the_dataset(python, server, tmp_path):
    base, md5 = server
    result = run_download(python, tmp_path / "data", "--url", f"{base}/good/{ARCHIVE}", "--md5", md5)
    assert result.returncode == 0, result.stderr
    assert missing_dataset_files(str(tmp_path / "data")) == ()
    assert os.listdir(tmp_path / "data") == ["cifar-100-python"]  # no temporary directory left


@pytest.mark.parametrize("python", INTERPRETERS)
def test_the_published_md5_is_checked_by_default(python, server, tmp_path):
    base, _ = server
    result = run_download(python, tmp_path / "data", "--url", f"{base}/good/{ARCHIVE}")
    assert result.returncode == 1
    assert f"expected {ARCHIVE_MD5}: the download is corrupt, run `make data` again" in result.stderr
    assert os.listdir(tmp_path / "data") == []


@pytest.mark.parametrize("python", INTERPRETERS)
def test_a_corrupted_transfer_leaves_nothing_behind(python, server, tmp_path):
    base, md5 = server
    result = run_download(python, tmp_path / "data", "--url", f"{base}/corrupt/{ARCHIVE}", "--md5", md5)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("ddp_contract download: error: downloaded archive has md5")
    assert os.listdir(tmp_path / "data") == []


@pytest.mark.parametrize("python", INTERPRETERS)
def test_an_interrupted_transfer_is_named_and_leaves_nothing_behind(python, server, tmp_path):
    base, md5 = server
    result = run_download(python, tmp_path / "data", "--url", f"{base}/cut/{ARCHIVE}", "--md5", md5)
    assert result.returncode == 1
    assert "stopped after" in result.stderr and "run `make data` again" in result.stderr
    assert os.listdir(tmp_path / "data") == []


def test_a_failed_download_keeps_the_dataset_that_was_there(server, tmp_path):
    base, _ = server
    before = write_dataset(tmp_path, train=4, test=2)
    contents = {name: (before / name).read_bytes() for name in DATASET_FILES}
    result = run_download(sys.executable, tmp_path, "--url", f"{base}/cut/{ARCHIVE}")
    assert result.returncode == 1
    assert {name: (before / name).read_bytes() for name in DATASET_FILES} == contents
    assert sorted(os.listdir(tmp_path)) == ["cifar-100-python"]


def test_an_unreachable_server_is_one_line_naming_the_login_node(tmp_path):
    result = run_download(sys.executable, tmp_path / "data", "--url", "http://127.0.0.1:9/x.tar.gz")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("ddp_contract download: error: could not download")
    assert "run this on a login node" in result.stderr


def test_usage_mistakes_exit_2():
    assert run_download(sys.executable, Path("a"), "b").returncode == 2
    assert run_download(sys.executable, Path("a"), "--proxy", "x").returncode == 2


@pytest.mark.parametrize("name,kind", [("../escape", tarfile.REGTYPE), ("/etc/evil", tarfile.REGTYPE),
                                       ("cifar-100-python/link", tarfile.SYMTYPE)])
def test_members_outside_the_tree_or_not_plain_files_are_refused(tmp_path, name, kind):
    # Python 3.6's tarfile has no extraction filter (PEP 706 came in 3.12), so the downloader checks.
    path = tmp_path / "bad.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        member = tarfile.TarInfo(name)
        member.type = kind
        member.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
        tar.addfile(member, None if kind == tarfile.SYMTYPE else __import__("io").BytesIO(b""))
    with pytest.raises(DownloadError, match="not a plain file inside it"):
        unpack(str(path), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(PYTHON36 is None, reason="no python3.6 here (pyenv install 3.6.15)")
def test_make_data_runs_the_login_nodes_python_without_a_venv(server, tmp_path):
    base, _ = server
    plan = subprocess.run(["make", "-n", "data", f"PYTHON={PYTHON36}", f"DATA_DIR={tmp_path}/d"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "pip" not in plan.stdout and "venv" not in plan.stdout
    result = subprocess.run(["make", "--no-print-directory", "data", f"PYTHON={PYTHON36}", f"DATA_DIR={tmp_path}/d",
                             f"CIFAR_URL={base}/good/{ARCHIVE}"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    # Our small archive is not the published one: python3.6 ran the whole download, then the MD5 check.
    assert result.returncode != 0
    assert f"expected {ARCHIVE_MD5}: the download is corrupt" in result.stderr
