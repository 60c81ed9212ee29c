"""`ddp-train --download`: verified, atomic, and never from inside a distributed job."""

import tarfile

import pytest

from ddp_train.download import download_cifar100, refuse_inside_job
from ddp_train.errors import TrainError
from ddp_train.layout import file_md5, has_dataset
from ddp_train.synthetic import write_dataset


@pytest.fixture()
def archive(tmp_path):
    """A local stand-in for the official tarball, served through a file:// URL."""
    source = tmp_path / "source"
    write_dataset(source, train=8, test=4)
    path = tmp_path / "cifar-100-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(source / "cifar-100-python", arcname="cifar-100-python")
    return path


def test_download_verifies_and_extracts_into_the_data_dir(archive, tmp_path):
    data_dir = tmp_path / "data"
    download_cifar100(data_dir, url=archive.as_uri(), archive_md5=file_md5(archive))
    assert has_dataset(data_dir)
    assert [p.name for p in data_dir.iterdir()] == ["cifar-100-python"]  # no temporaries left


def test_archive_with_the_wrong_checksum_leaves_nothing_behind(archive, tmp_path):
    data_dir = tmp_path / "data"
    with pytest.raises(TrainError, match="download is corrupt"):
        download_cifar100(data_dir, url=archive.as_uri(), archive_md5="0" * 32)
    assert list(data_dir.iterdir()) == []


def test_unreachable_url_is_a_clear_error(tmp_path):
    with pytest.raises(TrainError, match="could not download.*login node"):
        download_cifar100(tmp_path, url=(tmp_path / "missing.tar.gz").as_uri())


def test_download_refuses_to_run_inside_a_distributed_job():
    refuse_inside_job({})
    refuse_inside_job({"WORLD_SIZE": "1"})
    with pytest.raises(TrainError, match="make data"):
        refuse_inside_job({"WORLD_SIZE": "4", "RANK": "0"})


def test_the_dataset_is_there_only_with_the_files_the_job_scripts_check(tmp_path):
    # The trainer and the job scripts' `python3 -m ddp_contract dataset DIR` answer alike.
    from ddp_contract import DATASET_FILES, missing_dataset_files
    root = write_dataset(tmp_path, train=4, test=2)
    assert has_dataset(tmp_path) and missing_dataset_files(str(tmp_path)) == ()
    for name in DATASET_FILES:
        (root / name).rename(tmp_path / name)
        assert not has_dataset(tmp_path), f"without {name}"
        (tmp_path / name).rename(root / name)


def test_an_archive_without_the_meta_file_names_it(tmp_path):
    source = tmp_path / "source"
    (write_dataset(source, train=8, test=4) / "meta").unlink()
    path = tmp_path / "cifar-100-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(source / "cifar-100-python", arcname="cifar-100-python")
    with pytest.raises(TrainError, match="did not contain cifar-100-python/meta$"):
        download_cifar100(tmp_path / "data", url=path.as_uri(), archive_md5=file_md5(path))
