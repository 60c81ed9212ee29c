"""The base image a site's build starts from, out of containers/base-images.json: for the Makefile.

Run by the login node's own python3 (3.6 on SLES 15), standard library only:
    python3 containers/base_image.py SITE sif|docker
prints one line. `sif` is the image pre-pulled on the cluster; a glob picks its newest match
(build tags are timestamps, so the last in sort order), and where nothing matches the
pattern is printed as written, so the Makefile's `-f` test fails and it pulls `docker` instead.
"""

import glob
import json
import os
import sys

IMAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "base-images.json")
FIELDS = ("sif", "docker")


def base_image(images, site, field):
    """The field's value for the site; ValueError with the fix when either is unknown."""
    if site not in images or site == "schema":
        known = ", ".join(sorted(name for name in images if name != "schema"))
        raise ValueError("no base image for site {!r} in {} (known: {}): add it there".format(site, IMAGES, known))
    if field not in FIELDS:
        raise ValueError("unknown field {!r}: one of {}".format(field, ", ".join(FIELDS)))
    value = images[site][field]
    if field == "sif":
        matches = sorted(glob.glob(value))
        return matches[-1] if matches else value
    return value


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: python3 containers/base_image.py SITE sif|docker\n")
        return 2
    with open(IMAGES) as handle:
        images = json.load(handle)
    try:
        print(base_image(images, argv[0], argv[1]))
    except ValueError as error:
        sys.stderr.write("error: {}\n".format(error))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
