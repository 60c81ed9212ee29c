"""Every stop signal a cluster may send (USR2 by our scripts, USR1, TERM) sets the stop flag."""

from __future__ import annotations

import os
import signal

import pytest

from ddp_train.signals import StopFlag, signal_name


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
