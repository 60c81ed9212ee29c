"""The build arguments that make an image's %help its site's, out of the site profile: for the Makefile.

Run by the login node's own python3 (3.6 on SLES 15), standard library and the launcher's host modules
(entrypoints/host-modules.txt) only, with PYTHONPATH=entrypoints:
    python3 containers/image_help.py [SITE]
prints one line of `--build-arg NAME=VALUE` words, shell-quoted, for gpu.def's HELP_* arguments: the
command that runs the image there (the profile's container_runtime: LUMI has SingularityCE's
`singularity` and no `apptainer`), the variable that command reads binds from (APPTAINER_BIND,
SINGULARITY_BIND: their user guides, "Bind Paths and Mounts"), its GPU flag (the profile's accelerator:
--nv, --rocm), the srun options its steps need (the profile's srun_args: Slingshot's
--network=disable_rdzv_get) and the site's name. No SITE: the defaults of an image without a site.
"""

import shlex
import sys

from ddp_launch.accelerators import site_accelerator
from ddp_launch.errors import LaunchError
from ddp_launch.sites import load_site

NO_SITE = "NAME"  # what the help of an image without a site says in --site's place


def help_arguments(site, env):
    """{HELP_* argument: value} for site (None: no site)."""
    profile = load_site(site, env) if site else None
    runtime = profile.container_runtime if profile else "apptainer"
    srun = ["srun"] + [arg.value for arg in profile.srun_args] if profile else ["srun"]
    return {
        "HELP_RUNTIME": runtime,
        "HELP_BIND_VARIABLE": "{}_BIND".format(runtime.upper()),
        "HELP_GPU_FLAG": site_accelerator(site, env).apptainer_flag,
        "HELP_SRUN": " ".join(srun),
        "HELP_SITE": site or NO_SITE,
    }


def build_arg_words(arguments):
    return " ".join("--build-arg {}".format(shlex.quote("{}={}".format(name, value)))
                    for name, value in sorted(arguments.items()))


def main(argv, env):
    if len(argv) > 1:
        sys.stderr.write("usage: python3 containers/image_help.py [SITE]\n")
        return 2
    try:
        print(build_arg_words(help_arguments(argv[0] if argv else None, env)))
    except LaunchError as error:
        sys.stderr.write("error: {}\n".format(error))
        return 2
    return 0


if __name__ == "__main__":
    import os
    sys.exit(main(sys.argv[1:], os.environ))
