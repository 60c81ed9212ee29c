"""Which memory-registration cache monitor a libfabric uses when FI_MR_CACHE_MONITOR is unset, read from
the library file itself, so the launcher can leave a host's kdreg2 alone instead of forcing userfaultfd.

HPE's Slingshot NCCL and RCCL guides (HewlettPackard/shs-ccl-docs, nccl/nccl_tuning_guide.md and
rccl/rccl_tuning_guide.md, "Memory Registration") name three monitors, recommend userfaultfd and list
kdreg2 as "another valid option"; LUMI's AI guide announces kdreg2 as the coming default
(Lumi-supercomputer/LUMI-AI-Guide PR #118). libfabric chooses its default when it is built
(ofiwg/libfabric prov/util/src/util_mem_monitor.c, ofi_monitors_init):
- `./configure --with-default-monitor=NAME` (libfabric >= 2.0, commit c677d1ec6) makes NAME the
  default, and writes NAME into FI_MR_CACHE_MONITOR's own help text, which `fi_info -e` prints and
  the library carries: "... loadable Linux kernel module. kdreg2 is the default if available on the
  system." Without the option that text says "Userfaultfd is the default", whatever the default is.
- otherwise the first monitor built in, in an order that changed in libfabric 2.4.0 (commit
  1009ad850, "Use kdreg2 instead of memhooks as default when available"): kdreg2, memhooks,
  userfaultfd; before it memhooks, userfaultfd, kdreg2. The kdreg2 monitor is built in where its
  start-up message, "Kdreg2 memory monitor started", is in the library (kdreg2_mem_monitor.c, all
  under HAVE_KDREG2_MONITOR).
The version comes from the real file name: libtool names the library libfabric.so.1.<age>.<revision>,
and libfabric 2.4.0's -version-info 31:0:30 is the first with age 30 (Makefile.am of each release).
kdreg2 also needs its kernel module, whose device libfabric opens (/dev/kdreg2, kdreg2.h's
KDREG2_DEVICE_NAME): without it the monitor cannot start, so the facts ask for both.
"""

from __future__ import annotations

import re

KDREG2 = "kdreg2"
KDREG2_DEVICE = "/dev/kdreg2"
# The help text's sentence: the configured default's name, or the literal "Userfaultfd" of a build
# without --with-default-monitor (then it says nothing of the default).
_HELP_DEFAULT = re.compile(rb"loadable Linux kernel module\. (\w+) is the default if available on the system")
_NOT_CONFIGURED = b"Userfaultfd"
_KDREG2_BUILT_IN = b"Kdreg2 memory monitor started"
_CONFIGURE_NAMES = {b"uffd": "userfaultfd", b"memhooks": "memhooks", b"kdreg2": KDREG2, b"disabled": "disabled"}
_REAL_NAME = re.compile(r"libfabric\.so\.1\.(\d+)\.\d+$")
FIRST_KDREG2_FIRST_AGE = 30   # libfabric 2.4.0: -version-info 31:0:30


def default_monitor(library: bytes, real_name: str) -> str | None:
    """The monitor this libfabric uses when FI_MR_CACHE_MONITOR is unset (userfaultfd, memhooks, kdreg2,
    disabled), or None where the file does not say (an older libfabric, a name without its version)."""
    said = _HELP_DEFAULT.search(library)
    if said is not None and said.group(1) != _NOT_CONFIGURED:
        return _CONFIGURE_NAMES.get(said.group(1))
    if _KDREG2_BUILT_IN not in library:
        return None  # memhooks or userfaultfd, whichever is built in: not kdreg2, and not told apart here
    age = _REAL_NAME.search(real_name)
    if age is None:
        return None
    return KDREG2 if int(age.group(1)) >= FIRST_KDREG2_FIRST_AGE else None
