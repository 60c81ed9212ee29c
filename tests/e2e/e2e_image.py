"""Build the e2e test image with Charliecloud from the real recipe, caching the slow layers.

The project image is `ch-image build` of containers/Dockerfile (generated from
containers/gpu.def, x86_64) with only BASE_IMAGE swapped for an offline test base:
debootstrap's Debian + python3 + torch/numpy from the pip sources this machine is
configured with. The base is built once per recipe hash and kept in ch-image's storage
as ddp-e2e-base:<hash>; the project layer is rebuilt on every call (seconds).
Usage: python tests/e2e/e2e_image.py build   (prints the image name; `make e2e-image`)
"""
from __future__ import annotations

import configparser
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DDP_E2E_IMAGE_CACHE", "/var/tmp/ddp-e2e-images"))
STORAGE = CACHE / "storage"
# One project image per cluster prefix (conftest.PREFIX): working trees that share this
# machine's image cache must not run, or copy half-built, each other's images.
_PREFIX = os.environ.get("DDP_E2E_PREFIX", "ddpe2e")
IMAGE_NAME = "ddp-e2e-train" if _PREFIX == "ddpe2e" else f"ddp-e2e-train-{_PREFIX}"
DEFINITION = "containers/gpu.def"
DOCKERFILE = "containers/Dockerfile"
# ch-image is a Python program needing python3-lark, which only Debian's interpreter has.
CH_PYTHON = "/usr/bin/python3"
# PyPI has no CPU-only torch for Linux (its torch==2.14.1 is the CUDA 13 build with 3 GiB
# of nvidia-* wheels, which made every build copy 5.7 GiB); the pip sources configured
# here carry a CPU wheel. Override with DDP_E2E_TORCH, e.g. "torch==2.14.1".
TORCH = os.environ.get("DDP_E2E_TORCH", "torch==2.13.0+cpu")
RECIPE_VERSION = 1  # bump when the steps below change


class ImageError(RuntimeError):
    """The image could not be built; the message says which step and why."""


@dataclass(frozen=True)
class BaseRecipe:
    """Everything the cached base depends on; its hash names the cache entry."""

    suite: str
    mirror: str
    packages: tuple
    pip_packages: tuple
    pip_conf: str
    version: int = RECIPE_VERSION

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def tag(self) -> str:
        return f"ddp-e2e-base:{self.key()}"


def missing_tools() -> str | None:
    """Why this machine cannot build or run the image, or None."""
    if os.geteuid() != 0:
        return "needs root (debootstrap, and ch-run inside the SLURM nodes' namespaces)"
    for tool in ("ch-image", "ch-run", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (make sysdeps installs charliecloud and debootstrap)"
    if subprocess.run([CH_PYTHON, "-c", "import lark"], capture_output=True).returncode != 0:
        return f"{CH_PYTHON} cannot import lark, which ch-image needs (apt-get install python3-lark)"
    return None


def debian_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt already uses (deb822 .sources or one-line .list files)."""
    candidates = sorted(sources_dir.glob("sources.list.d/*.sources")) + [sources_dir / "sources.list"] \
        + sorted(sources_dir.glob("sources.list.d/*.list"))
    for path in candidates:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for match in re.finditer(r"^URIs:\s*(\S+)|^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M):
            uri = match.group(1) or match.group(2)
            if uri.rstrip("/").endswith("/debian"):
                return uri
    raise ImageError(f"no Debian mirror found in {sources_dir}/sources.list or sources.list.d/")


def pip_configuration() -> str:
    """pip's effective configuration here (`pip config list`), as an /etc/pip.conf text."""
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    parser = configparser.ConfigParser(interpolation=None)
    for line in done.stdout.splitlines():
        match = re.match(r"^(:env:|[\w-]+)\.([\w-]+)='(.*)'$", line)
        if not match:
            continue
        section = "global" if match.group(1) == ":env:" else match.group(1)
        if not parser.has_section(section):
            parser.add_section(section)
        parser.set(section, match.group(2), match.group(3))
    lines = []
    for section in parser.sections():
        lines.append(f"[{section}]")
        lines += [f"{name} = {value}" for name, value in sorted(parser.items(section))]
    return "\n".join(lines) + "\n"


def local_pip_sources(pip_conf: str) -> list[str]:
    """Directories pip reads from on this machine (file:// indexes, find-links), to bind in."""
    found = []
    for word in re.findall(r"(?:file://)?(/[^\s]+)", pip_conf):
        path = Path(word)
        directory = path.parent if path.name == "simple" else path
        if directory.is_dir() and str(directory) not in found and not str(directory).startswith("/etc"):
            found.append(str(directory))
    return found


def base_recipe() -> BaseRecipe:
    return BaseRecipe(suite="bookworm", mirror=debian_mirror(), packages=("python3", "python3-pip"),
                      pip_packages=(TORCH, "numpy"), pip_conf=pip_configuration())


def _log(message: str) -> None:
    print(f"e2e-image: {message}", file=sys.stderr, flush=True)


def _run(argv: list[str], step: str, log: Path | None = None, env: dict | None = None) -> str:
    started = time.monotonic()
    merged = {**os.environ, "USER": os.environ.get("USER") or "root", **(env or {})}
    done = subprocess.run(argv, capture_output=True, text=True, env=merged)
    if log is not None:
        log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise ImageError(f"{step} failed (exit {done.returncode}):\n{tail}")
    _log(f"{step}: {time.monotonic() - started:.0f} s")
    return done.stdout


def ch_image(*args: str, step: str, log: Path | None = None) -> str:
    return _run([CH_PYTHON, shutil.which("ch-image") or "ch-image", "--storage", str(STORAGE), *args],
                step, log)


def stored_images() -> set[str]:
    if not (STORAGE / "img").is_dir():
        return set()
    return set(ch_image("list", step="ch-image list").split())


def build_base(recipe: BaseRecipe) -> None:
    """debootstrap + pip into a tree, then import it as recipe.tag (the slow, cached part)."""
    tree = CACHE / f"base-{recipe.key()}"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    logs = CACHE / "logs"
    logs.mkdir(exist_ok=True)
    _run(["debootstrap", "--variant=minbase", "--include=" + ",".join(recipe.packages), recipe.suite,
          str(tree), recipe.mirror], "debootstrap", logs / "debootstrap.log")
    # debootstrap leaves device nodes in /dev; ch-run binds the host's /dev, and copying
    # /dev/zero or /dev/full as files would never end.
    for entry in (tree / "dev").iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    # pip in the image uses this machine's sources: its config, CA bundle and local indexes.
    (tree / "etc/pip.conf").write_text(recipe.pip_conf)
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if bundle.is_file():
        (tree / "etc/ssl/certs").mkdir(parents=True, exist_ok=True)
        shutil.copy(bundle, tree / "etc/ssl/certs/ca-certificates.crt")
    binds = []
    for source in local_pip_sources(recipe.pip_conf):
        (tree / source.lstrip("/")).mkdir(parents=True, exist_ok=True)
        binds += ["-b", f"{source}:{source}"]
    _run(["ch-run", "-w", *binds, str(tree), "--", "python3", "-m", "pip", "install", "--no-cache-dir",
          "--break-system-packages", "--root-user-action=ignore", *recipe.pip_packages],
         f"pip install {' '.join(recipe.pip_packages)}", logs / "pip.log",
         env={"PIP_CONFIG_FILE": "/etc/pip.conf"})
    ch_image("import", str(tree), recipe.tag, step=f"ch-image import {recipe.tag}", log=logs / "import.log")
    shutil.rmtree(tree)


def empty_default_arguments(dockerfile: str) -> list[str]:
    """`--build-arg NAME=` for each `ARG NAME=""`: Docker reads that default as the empty
    string, ch-image 0.31's grammar as a two-character word `""`, so it is passed explicitly."""
    return [word for name in re.findall(r'^ARG (\w+)=""$', dockerfile, re.M) for word in ("--build-arg", f"{name}=")]


def build(rebuild_base: bool = False) -> str:
    """The project image's name in STORAGE, built on the cached base; one build at a time."""
    reason = missing_tools()
    if reason:
        raise ImageError(reason)
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        recipe = base_recipe()
        if rebuild_base or recipe.tag not in stored_images():
            _log(f"building base {recipe.tag} (once per recipe: debootstrap {recipe.suite}, "
                 f"pip install {' '.join(recipe.pip_packages)})")
            build_base(recipe)
        else:
            _log(f"reusing base {recipe.tag}")
        ch_image("build", "--no-cache", "--build-arg", f"BASE_IMAGE={recipe.tag}",
                 *empty_default_arguments((REPO / DOCKERFILE).read_text()), "-t", IMAGE_NAME,
                 "-f", str(REPO / DOCKERFILE), str(REPO), step=f"ch-image build {DOCKERFILE}",
                 log=CACHE / "logs" / "build.log")
    return IMAGE_NAME


def write_pointer(path: Path, name: str = IMAGE_NAME) -> Path:
    """The file the job scripts see as the image (`[ -f "$DDP_IMAGE" ]`), next to this
    test's own view of the image: a hard-linked copy (seconds, no data copied), so the
    bind points the apptainer stand-in creates never leak into another test."""
    root = path.parent / f"{path.stem}.image"
    shutil.rmtree(root, ignore_errors=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # never a copy of an image that a build is replacing
        _run(["cp", "-al", str(STORAGE / "img" / name), str(root)], f"hard-linked copy of {name}")
    path.write_text(json.dumps({"charliecloud_root": str(root), "definition": str(REPO / DEFINITION),
                                "dockerfile": str(REPO / DOCKERFILE)}) + "\n")
    return path


def main(argv: list[str]) -> int:
    if argv[:1] != ["build"]:
        print("usage: image.py build [--rebuild-base]", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        name = build(rebuild_base="--rebuild-base" in argv)
    except ImageError as error:
        print(f"e2e-image: error: {error}", file=sys.stderr)
        return 1
    _log(f"image {name} in {STORAGE} ready in {time.monotonic() - started:.0f} s")
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
