"""benchmarks/argv_walk.py's figures: files entered, and returns to a file already left."""

from argv_walk import figures, returns_by_import


def test_a_return_is_counting_a_file_left_before_not_the_next_file():
    assert figures(["cli.py", "config.py", "cli.py", "train.py", "config.py", "train.py"]) == (3, 3)
    assert figures(["cli.py", "config.py", "train.py"]) == (3, 0)
    assert figures(["cli.py"]) == (1, 0)


def test_an_import_return_is_one_made_by_entering_or_leaving_a_modules_top_level():
    # cli imports train (2 moves), train imports data (2), then train calls into data and back (2).
    trail = ["cli.py", "train.py", "data.py", "train.py", "cli.py", "train.py", "data.py", "train.py"]
    loading = [False, True, True, True, True, False, False, False]
    assert figures(trail) == (3, 5)
    assert returns_by_import(trail, loading) == 2  # data.py -> train.py and train.py -> cli.py, by import
    assert returns_by_import(trail, [False] * len(trail)) == 0
