"""The fabric modules, in the order detection tries them: ddp_contract.fabrics names them, and each is
the module of that name in this package, of the shape fabric.common.Fabric describes.

Read by name so that a new fabric is its module, its data file and its name in the contract, which
the host's python3 reads too; the registry imports nothing of this package itself, so the defaults'
reader (fabric/defaults.py) may ask it which fabrics have a data file.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from ddp_contract import fabrics


def registered() -> tuple[ModuleType, ...]:
    """Every fabric's module, in detection order (Ethernet, every node's, last)."""
    return tuple(import_module(f"{__package__}.{name}") for name in fabrics.FABRICS)


def fabric_named(name: str) -> ModuleType:
    """The module of the fabric a site profile names (ddp_contract.sites checked it is one)."""
    for fabric in registered():
        if fabric.NAME == name:
            return fabric
    raise ValueError(f"no fabric module is named {name!r}")  # the site profile's reader refused it
