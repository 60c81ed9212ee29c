"""ddp-launch: turn a scheduler's environment into a correct torchrun launch.

Standard library only: it must run on a login node and inside any image
before torch is importable.
"""

__version__ = "0.1.0"
