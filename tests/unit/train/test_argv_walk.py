"""benchmarks/argv_walk.py's figures: files entered, and returns to a file already left."""

from argv_walk import figures


def test_a_return_is_counting_a_file_left_before_not_the_next_file():
    assert figures(["cli.py", "config.py", "cli.py", "train.py", "config.py", "train.py"]) == (3, 3)
    assert figures(["cli.py", "config.py", "train.py"]) == (3, 0)
    assert figures(["cli.py"]) == (1, 0)
