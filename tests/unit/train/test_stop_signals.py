"""Every stop signal a cluster may send (USR2 by our scripts, USR1, TERM) sets the stop flag."""

from __future__ import annotations

import os
import signal

import pytest

from ddp_train.safety.signals import StopFlag, read_stop_request, signal_name, stop_request_path


@pytest.mark.parametrize("signum", [signal.SIGUSR2, signal.SIGUSR1, signal.SIGTERM])
def test_a_stop_signal_is_recorded_not_fatal_and_the_old_handler_comes_back(signum):
    before = signal.getsignal(signum)
    flag = StopFlag().install()
    try:
        assert flag.signum == 0
        os.kill(os.getpid(), signum)  # would end this process without the handler
        assert flag.signum == signum
        assert signal_name(flag.signum) == signal.Signals(signum).name
    finally:
        flag.uninstall()
    assert signal.getsignal(signum) == before


# The job scripts ask for --signal=B:USR2@120 (the batch shell alone, sbatch(1)) and their
# trap writes the signal's name into the run dir: rank 0's flag reads it.

def test_a_stop_request_file_names_the_signal_to_stop_on(tmp_path):
    request = tmp_path / ".ddp-stop-request"
    flag = StopFlag(request, poll_s=0)
    assert flag.requested() == 0
    request.write_text("SIGUSR2\n")
    assert flag.requested() == signal.SIGUSR2
    request.unlink()
    assert flag.requested() == signal.SIGUSR2  # a stop once asked for stays asked for


@pytest.mark.parametrize("text, expected", [("USR1", signal.SIGUSR1), ("sigterm", signal.SIGTERM),
                                            ("", signal.SIGUSR2), ("whatever", signal.SIGUSR2)])
def test_a_request_without_a_stop_signal_we_know_stops_as_usr2(tmp_path, text, expected):
    (tmp_path / "r").write_text(text)
    assert read_stop_request(tmp_path / "r") == expected


def test_an_unreadable_request_is_no_stop(tmp_path):
    (tmp_path / "dir").mkdir()
    assert read_stop_request(tmp_path / "dir") == 0  # IsADirectoryError: never a made-up stop
    assert read_stop_request(tmp_path / "missing") == 0


def test_the_request_file_is_read_at_most_once_per_poll_interval(tmp_path):
    # One stat on a shared file system per poll, not one per step: a request written between
    # two polls is seen at the next.
    request = tmp_path / "r"
    flag = StopFlag(request, poll_s=3600)
    assert flag.requested() == 0
    request.write_text("USR2")
    assert flag.requested() == 0


def test_a_received_signal_wins_and_the_request_is_cleared_once_acted_on(tmp_path):
    request = stop_request_path(tmp_path)
    request.write_text("USR2")
    flag = StopFlag(request, poll_s=0).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.requested() == signal.SIGTERM
    finally:
        flag.uninstall()
    flag.clear_request()
    assert not request.exists()
    flag.clear_request()  # twice: nothing to remove is fine


def test_ranks_other_than_0_never_read_the_file(tmp_path):
    (tmp_path / ".ddp-stop-request").write_text("USR2")
    assert StopFlag(None, poll_s=0).requested() == 0
