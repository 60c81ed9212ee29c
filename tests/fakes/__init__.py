"""Fakes the test suites share: node trees laid out like real nodes (node.py) and real ELF host
libraries built with cc (elf_tree.py). On sys.path through pyproject.toml's pytest `pythonpath`.
"""
