"""The progress bar draws only on a terminal; batch logs stay plain."""

import io

from ddp_train.progress import ProgressBar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_draws_on_a_terminal():
    stream = Terminal()
    bar = ProgressBar(4, "Epoch 1/2", enabled=True, stream=stream)
    bar.update(4, 512)
    bar.close()
    assert "Epoch 1/2 [" in stream.getvalue() and "4/4" in stream.getvalue()


def test_silent_when_not_a_terminal_or_not_rank_zero():
    for stream, enabled in ((io.StringIO(), True), (Terminal(), False)):
        bar = ProgressBar(4, "Epoch 1/2", enabled=enabled, stream=stream)
        bar.update(4, 512)
        bar.close()
        assert stream.getvalue() == ""
