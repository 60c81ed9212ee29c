"""Reading CIFAR-100 pickles in the real on-disk format, and the errors for bad datasets."""

import pickle

import numpy as np
import pytest
import torch

from ddp_train import cli
from ddp_train.recipe.data import load_split, normalize
from ddp_train.errors import TrainError
from ddp_train.synthetic import write_dataset


@pytest.fixture()
def data_dir(tmp_path):
    write_dataset(tmp_path, train=64, test=21, seed=1)
    return tmp_path


def test_reads_the_same_images_and_labels_as_torchvision(data_dir, monkeypatch):
    cifar = pytest.importorskip("torchvision.datasets.cifar")
    # Generated files are not the official ones; torchvision checks md5s before reading.
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    reference = cifar.CIFAR100(str(data_dir), train=True, download=False)
    split = load_split(data_dir, "train", verify=False)
    assert split.images.dtype == torch.uint8 and split.images.shape == (64, 3, 32, 32)
    assert torch.equal(split.images.permute(0, 2, 3, 1), torch.from_numpy(reference.data))
    assert split.labels.tolist() == reference.targets


def test_generated_files_fail_the_official_checksum_unless_allowed(data_dir):
    with pytest.raises(TrainError, match="official CIFAR-100 checksum.*--allow-unverified-data"):
        load_split(data_dir, "test", verify=True)
    assert len(load_split(data_dir, "test", verify=False)) == 21


def test_missing_dataset_names_make_data_and_the_directory(tmp_path):
    with pytest.raises(TrainError) as excinfo:
        load_split(tmp_path / "nowhere", "train", verify=True)
    message = str(excinfo.value)
    assert "make data" in message and str(tmp_path / "nowhere") in message


def test_truncated_pickle_is_a_clear_error(data_dir):
    path = data_dir / "cifar-100-python" / "train"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(TrainError, match="not a readable CIFAR-100 pickle.*make data"):
        load_split(data_dir, "train", verify=False)


def test_pickle_that_would_run_code_is_refused(data_dir):
    class Exploit:
        def __reduce__(self):
            return (print, ("pwned",))

    (data_dir / "cifar-100-python" / "train").write_bytes(pickle.dumps({"data": Exploit()}))
    with pytest.raises(TrainError, match="unexpected object builtins.print"):
        load_split(data_dir, "train", verify=False)


def test_wrong_shape_is_a_clear_error(data_dir):
    bad = {"data": np.zeros((4, 100), dtype=np.uint8), "fine_labels": [0, 1, 2, 3]}
    (data_dir / "cifar-100-python" / "test").write_bytes(pickle.dumps(bad, protocol=2))
    with pytest.raises(TrainError, match="data shape"):
        load_split(data_dir, "test", verify=False)


def test_missing_dataset_via_cli_is_one_line_and_exit_2(tmp_path, capsys):
    code = cli.main(["--data-dir", str(tmp_path / "empty"), "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("ddp-train: error: CIFAR-100 not found") and err.count("\n") == 1
    assert "make data" in err


def test_corrupt_pickle_via_cli_is_one_line_and_exit_2(data_dir, tmp_path, capsys):
    (data_dir / "cifar-100-python" / "test").write_bytes(b"\x80\x02garbage")
    code = cli.main(["--data-dir", str(data_dir), "--run-dir", str(tmp_path / "run"),
                     "--allow-unverified-data", "--batch-size", "32", "--width-scale", "0.0625"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("ddp-train: error: ") and err.count("\n") == 1
    assert "test is not a readable CIFAR-100 pickle" in err


def test_normalize_gives_zero_mean_unit_std_per_channel_for_dataset_statistics():
    mean = torch.tensor([0.5071, 0.4865, 0.4409]).view(1, 3, 1, 1) * 255
    x = normalize(mean.round().to(torch.uint8).expand(2, 3, 4, 4))
    assert x.abs().max() < 0.01 and x.dtype == torch.float32
