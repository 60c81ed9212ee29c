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


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_batch_log_gets_a_plain_line_every_interval_and_no_carriage_returns():
    # Batch logs are not terminals: a carriage-return bar would be one unreadable line
    # (SLURM writes a job's stdout to a file; isatty() is False there).
    stream, clock = io.StringIO(), Clock()
    bar = ProgressBar(100, "Epoch 3/50", enabled=True, stream=stream, line_every_s=30, clock=clock)
    for step in range(1, 101):
        clock.now = step * 1.0  # one step a second, 128 images a step
        bar.update(step, step * 128)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines == [
        "Epoch 3/50: step 30/100 (30%), 128 img/s, 0:30 elapsed, ~1:10 left",
        "Epoch 3/50: step 60/100 (60%), 128 img/s, 1:00 elapsed, ~0:40 left",
        "Epoch 3/50: step 90/100 (90%), 128 img/s, 1:30 elapsed, ~0:10 left",
    ]  # none at step 100: the epoch's own line follows


def test_silent_on_other_ranks():
    for stream in (io.StringIO(), Terminal()):
        clock = Clock()
        bar = ProgressBar(4, "Epoch 1/2", enabled=False, stream=stream, line_every_s=0, clock=clock)
        clock.now = 100.0
        bar.update(2, 256)
        bar.close()
        assert stream.getvalue() == ""
