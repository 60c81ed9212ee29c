"""The e2e test images, built from the real recipes on an offline base, caching the slow part.

The base: debootstrap's Debian + python3 + torch/torchvision/numpy from the pip sources
this machine is configured with, built once per recipe hash into
- base-<hash>.sif by the real `apptainer build base.sif DIR/` (in the cluster's root,
  tests/e2e/apptainer_root.py), the base of `make build-x86` (containers/gpu.def) and
  `make build-cpu` (containers/cpu.def) with only BOOTSTRAP/BASE_IMAGE swapped
  (build_sifs; our layer is rebuilt every session);
- ch-image's storage as ddp-e2e-base:<hash>, the base of `ch-image build` of
  containers/Dockerfile: the RunAI pod path, which has no Apptainer (build).
Usage: python tests/e2e/e2e_image.py build   (the Charliecloud image; `make e2e-image`)
"""
from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import pip_setup

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
TORCHVISION = os.environ.get("DDP_E2E_TORCHVISION", "torchvision==0.28.0")  # the one for torch 2.13
RECIPE_VERSION = 3  # bump when the steps below change


class ImageError(RuntimeError):
    """A step of building the test world failed. Its message is one line: the step, the
    first error line of its log, and the log's path (the whole output is there)."""

    def __init__(self, step: str, detail: str, log: Path | None = None):
        self.step, self.detail, self.log = step, detail, log
        super().__init__(f"{step}: {detail}" + (f" (log: {log})" if log is not None else ""))


# What marks a line as the error in the tools' logs: debootstrap's "E:", pip's "ERROR:",
# Apptainer's "FATAL:", make's "***", and the C library's messages.
_ERROR_LINE = re.compile(r"^(E:|ERROR|FATAL|error:|fatal:)|\*\*\*|[Ee]rror\b|[Ff]ailed|No such file|[Cc]annot ")


def first_error_line(output: str) -> str:
    """The line of a step's output that says what went wrong: the first that looks like an
    error, else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if _ERROR_LINE.search(line):
            return line
    return lines[-1] if lines else "no output"


@dataclass(frozen=True)
class BaseRecipe:
    """Everything the cached base depends on; its hash names the cache entry."""

    suite: str
    mirror: str
    packages: tuple
    pip_packages: tuple
    pip: pip_setup.PipSetup
    version: int = RECIPE_VERSION

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def tag(self) -> str:
        return f"ddp-e2e-base:{self.key()}"

    @property
    def sif(self) -> Path:
        return CACHE / f"base-{self.key()}.sif"


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
    """The Debian mirror apt already uses (deb822 .sources or one-line .list files), or
    DDP_E2E_DEBIAN_MIRROR (another mirror; the tests' own way to make debootstrap fail)."""
    if os.environ.get("DDP_E2E_DEBIAN_MIRROR"):
        return os.environ["DDP_E2E_DEBIAN_MIRROR"]
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
    raise ImageError("Debian mirror", f"none found in {sources_dir}/sources.list or sources.list.d/: "
                     "set DDP_E2E_DEBIAN_MIRROR to one")


def base_recipe() -> BaseRecipe:
    try:
        pip = pip_setup.machine_setup()
    except pip_setup.PipSetupError as error:
        raise ImageError("pip configuration", str(error)) from None
    return BaseRecipe(suite="bookworm", mirror=debian_mirror(), packages=("python3", "python3-pip"),
                      pip_packages=(TORCH, TORCHVISION, "numpy"), pip=pip)


def _log(message: str) -> None:
    print(f"e2e-image: {message}", file=sys.stderr, flush=True)


def run_step(argv: list, step: str, log: Path, env: dict | None = None, tag: str = "e2e-image") -> str:
    """argv as one step of building the test world: its output to log, its time to stderr;
    an ImageError that names the step, its first error line and the log when it fails."""
    started = time.monotonic()
    merged = {**os.environ, "USER": os.environ.get("USER") or "root", **(env or {})}
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=merged)
    except OSError as error:
        log.write_text(f"{argv[0]}: {error}\n")
        raise ImageError(step, f"cannot run {argv[0]}: {error.strerror}", log) from None
    return checked(done, step, log, tag, started)


def checked(done: subprocess.CompletedProcess, step: str, log: Path, tag: str = "e2e-image",
            started: float | None = None) -> str:
    """A finished step's output, written to log; an ImageError when it failed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise ImageError(step, f"exit {done.returncode}: {first_error_line(done.stdout + done.stderr)}", log)
    if started is not None:
        print(f"{tag}: {step}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return done.stdout


def ch_image(*args: str, step: str, log: Path) -> str:
    return run_step([CH_PYTHON, shutil.which("ch-image") or "ch-image", "--storage", str(STORAGE), *args],
                    step, log)


def stored_images() -> set[str]:
    if not (STORAGE / "img").is_dir():
        return set()
    return set(ch_image("list", step="ch-image list", log=CACHE / "logs" / "list.log").split())


def stored_path(tag: str) -> Path:
    """Where ch-image keeps an image's tree: its reference with '/' as '%' and ':' as '+'
    (Charliecloud's storage directory layout, `ch-image list` names)."""
    return STORAGE / "img" / tag.replace("/", "%").replace(":", "+")


def build_base(recipe: BaseRecipe) -> None:
    """debootstrap + pip into a tree, then import it as recipe.tag (the slow, cached part)."""
    tree = CACHE / f"base-{recipe.key()}"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    logs = CACHE / "logs"
    logs.mkdir(exist_ok=True)
    run_step(["debootstrap", "--variant=minbase", "--include=" + ",".join(recipe.packages), recipe.suite,
              tree, recipe.mirror], "debootstrap of the test base", logs / "debootstrap.log")
    # debootstrap leaves device nodes in /dev; ch-run binds the host's /dev, and copying
    # /dev/zero or /dev/full as files would never end.
    for entry in (tree / "dev").iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    # pip in the base reads this machine's configuration, with every file it names copied in
    # and every local package source bound in (pip_setup), and nothing of the PIP_* variables
    # that ch-run would otherwise pass through from here (ch-run(1): --unset-env, --set-env,
    # processed in order).
    try:
        binds = pip_setup.stage(recipe.pip, tree)
    except pip_setup.PipSetupError as error:
        raise ImageError("pip configuration", str(error)) from None
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if bundle.is_file() and not (tree / "etc/ssl/certs/ca-certificates.crt").is_file():
        (tree / "etc/ssl/certs").mkdir(parents=True, exist_ok=True)
        shutil.copy(bundle, tree / "etc/ssl/certs/ca-certificates.crt")
    run_step(["ch-run", "-w", "--unset-env=PIP_*", "--set-env=PIP_CONFIG_FILE=/etc/pip.conf", *binds, tree, "--",
              "python3", "-m", "pip", "install", "--no-cache-dir", "--break-system-packages",
              "--root-user-action=ignore", *recipe.pip_packages],
             "pip in the test base", logs / "pip.log")
    # Like python:3.12-slim, cpu.def's default base: its %post may pip install (PEP 668).
    for marker in (tree / "usr/lib").glob("python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    ch_image("import", str(tree), recipe.tag, step=f"ch-image import {recipe.tag}", log=logs / "import.log")
    shutil.rmtree(tree)


def build_base_sif(recipe: BaseRecipe, in_root) -> None:
    """recipe.sif from the stored base's tree, by the real `apptainer build` in the cluster's
    root as root (in_root runs argv there): a directory with no %post needs no container."""
    partial = recipe.sif.with_suffix(".partial")
    checked(in_root(["apptainer", "build", "--force", *BASE_SQUASHFS, partial, f"{stored_path(recipe.tag)}/"]),
            "the base SIF (apptainer build)", CACHE / "logs" / "base-sif.log")
    partial.rename(recipe.sif)


def empty_default_arguments(dockerfile: str) -> list[str]:
    """`--build-arg NAME=` for each `ARG NAME=""`: Docker reads that default as the empty
    string, ch-image 0.31's grammar as a two-character word `""`, so it is passed explicitly."""
    return [word for name in re.findall(r'^ARG (\w+)=""$', dockerfile, re.M) for word in ("--build-arg", f"{name}=")]


def ensure_base(in_root=None, rebuild_base: bool = False) -> BaseRecipe:
    """The cached base (ch-image tag, and the SIF when in_root is given), built when missing."""
    reason = missing_tools()
    if reason:
        raise ImageError("tools for the test base", reason)
    CACHE.mkdir(parents=True, exist_ok=True)
    recipe = base_recipe()
    # The base SIF, built already: no lock, which another worker may hold for minutes building an image of
    # its own (the LUMI one). It is made under a .partial name and renamed, so one that exists is whole. (`ch-image
    # list` stays under the lock, beside the steps that write ch-image's storage.)
    if in_root is not None and not rebuild_base and recipe.sif.exists():
        return recipe
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if rebuild_base or recipe.tag not in stored_images():
            _log(f"building base {recipe.tag} (once per recipe: debootstrap {recipe.suite}, "
                 f"pip install {' '.join(recipe.pip_packages)})")
            build_base(recipe)
        else:
            _log(f"reusing base {recipe.tag}")
        if in_root is not None and (rebuild_base or not recipe.sif.exists()):
            build_base_sif(recipe, in_root)
    return recipe


# The Makefile's --fakeroot, and lz4 instead of mksquashfs's gzip: a session's images are
# thrown away, so packing speed matters more than size (squashfuse and the kernel read both).
TEST_BUILD_FLAGS = "--fakeroot --mksquashfs-args '-comp lz4'"
# The bases too: with apptainer build's default (gzip) the x86_64 base alone took 66 s of a
# cold run, and every build on it decompresses it again.
BASE_SQUASHFS = ("--mksquashfs-args", "-comp lz4")


def build_scratch(directory: Path) -> list[str]:
    """make's arguments for where Apptainer caches and unpacks (the Makefile's BUILD_SCRATCH,
    checked by containers/build-space.sh): a directory the test user writes, and the room the
    test bases need (under 2 GB unpacked), not the NGC base's 40 GB."""
    return [f"BUILD_SCRATCH={directory}", "BUILD_MIN_FREE_GB=4"]


@dataclass(frozen=True)
class Sifs:
    x86: Path  # make build-x86: containers/gpu.def, ARCH=amd64, SITE empty
    cpu: Path  # make build-cpu: containers/cpu.def (its %post runs, with --fakeroot)


# What `make build-x86` / `make build-cpu` read: the definitions, the Makefile, and the
# directories their %files copy from.
PROJECT_INPUTS = ("Makefile", "pyproject.toml", "containers", "entrypoints", "src", "runai")
KEEP_UNUSED_S = 2 * 24 * 3600  # built images of other checkouts kept this long


def project_key(recipe: BaseRecipe, apptainer: str) -> str:
    """A hash of everything the project layer is built from (so an unchanged checkout reuses it)."""
    digest = hashlib.sha256(json.dumps([recipe.key(), apptainer, TEST_BUILD_FLAGS]).encode())
    for name in PROJECT_INPUTS:
        top = REPO / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path.suffix in (".pyc", ".sif"):
                continue
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_sifs(as_user, in_root, user: int) -> Sifs:
    """`make build-x86` and `make build-cpu` by the test user (uid user; as_user runs argv in
    the cluster's root as that user), on the cached base SIF: only BOOTSTRAP and BASE_IMAGE
    differ. Kept by a hash of their inputs, so a run with no change to them builds nothing."""
    recipe = ensure_base(in_root)
    version = checked(in_root(["apptainer", "--version"]), "apptainer --version", CACHE / "logs" / "version.log").strip()
    out = CACHE / f"sifs-{project_key(recipe, version)}"
    sifs = Sifs(x86=out / "train-x86_64.sif", cpu=out / "train-cpu.sif")
    if out.is_dir():  # whole: it is renamed into place when built (below); no lock, as in ensure_base
        _log(f"reusing {out} (no change to {', '.join(PROJECT_INPUTS)})")
        os.utime(out)
        return sifs
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.is_dir():
            _log(f"reusing {out} (no change to {', '.join(PROJECT_INPUTS)})")
            os.utime(out)
            return sifs
        for old in CACHE.glob("sifs-*"):
            if time.time() - old.stat().st_mtime > KEEP_UNUSED_S:
                shutil.rmtree(old, ignore_errors=True)
        partial = CACHE / f"building-{out.name}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        os.chown(partial, user, user)
        base = f"--build-arg BOOTSTRAP=localimage --build-arg BASE_IMAGE={recipe.sif}"

        def make(target: str, variable: str, path: Path) -> None:
            started = time.monotonic()
            checked(as_user(["make", "--no-print-directory", target, f"{variable}_SIF={partial / path.name}",
                             f"{variable}_BASE={base}", f"BUILD_FLAGS={TEST_BUILD_FLAGS}",
                             *build_scratch(partial / f".apptainer-{target}")]),
                    f"make {target}", CACHE / "logs" / f"{target}.log")
            _log(f"make {target}: {time.monotonic() - started:.0f} s")

        # Side by side, each in a scratch of its own: one build leaves a core idle much of its time (the
        # cpu image's %post, mksquashfs's single-threaded phases) while the e2e session's other workers
        # wait for both.
        targets = (("build-x86", "X86", sifs.x86), ("build-cpu", "CPU", sifs.cpu))
        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            for built in [pool.submit(make, *target) for target in targets]:
                built.result()
        for target, _, _ in targets:
            shutil.rmtree(partial / f".apptainer-{target}", ignore_errors=True)
        partial.rename(out)
    return sifs


# LUMI's twin's image (tests/e2e/twins.py): gpu.def as `make build-lumi` builds it, on a base laid out
# like the LUMI AI Factory's ROCm image (lumi_base). The other twins run the session's images: their
# scripts name their site (`--site olivia`, `--site raven`), which wins over an image's SITE default,
# and `make build-olivia`'s arm64 build runs in tests/e2e/test_make_build.py (no arm64 program runs here).
LUMI_SIF = "train-lumi-x86_64.sif"
LUMI_BASE_DEFINITION = "Bootstrap: localimage\nFrom: {base}\n\n%files\n{files}\n\n%post\n    ldconfig\n"


def lumi_base(recipe: BaseRecipe, as_user, user: int) -> Path:
    """The test base with LUMI's image layout (twins.lumi_image_tree: libfabric, libcxi and the RCCL
    plugin where ld.so.conf finds them, ldconfig run, no LD_LIBRARY_PATH), built by the test user
    with the real `apptainer build --fakeroot`; cached by the base's recipe. Call under build.lock."""
    import twins  # noqa: PLC0415 - the twins' module builds the libraries with cc

    # Kept by what it is built from: the base, the code that lays the libraries out, the definition.
    made_by = [inspect.getsource(twins.lumi_image_tree), inspect.getsource(twins.build_library)]
    key = hashlib.sha256(json.dumps([recipe.key(), *made_by, LUMI_BASE_DEFINITION, TEST_BUILD_FLAGS]).encode()
                         ).hexdigest()[:16]
    # Named as LUMI's own (containers/base-images.json: lumi-multitorch-torch-u24r70f21m50t210-<build>.sif): the
    # image labels its base by this path (gpu.def, org.opencontainers.image.base.name), which the doctor's
    # known issues for that image family read (containers/sites/known-issues).
    sif = CACHE / f"lumi-multitorch-torch-u24r70f21m50t210-e2e{key}.sif"
    if sif.exists():
        return sif
    work = CACHE / f"building-lumi-base-{key}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    files = twins.lumi_image_tree(work / "tree")
    lines = "\n".join(f"    {built} {target}" for target, built in files.items())
    definition = work / "lumi-base.def"
    definition.write_text(LUMI_BASE_DEFINITION.format(base=recipe.sif, files=lines))
    subprocess.run(["chmod", "-R", "a+rX", str(work)], check=True)
    os.chown(work, user, user)
    partial = work / "base-lumi.sif"
    started = time.monotonic()
    checked(as_user(["env", f"APPTAINER_TMPDIR={work}", f"APPTAINER_CACHEDIR={work}/cache", "apptainer", "build",
                     "--fakeroot", "--mksquashfs-args", "-comp lz4", partial, definition]),
            "the LUMI-like base SIF (apptainer build)", CACHE / "logs" / "base-lumi-sif.log")
    _log(f"LUMI-like base: {time.monotonic() - started:.0f} s")
    partial.rename(sif)
    shutil.rmtree(work, ignore_errors=True)
    return sif


def build_lumi_sif(sifs: Sifs, as_user, in_root, user: int) -> Path:
    """gpu.def built by `make build-lumi` on the LUMI-like base, beside the session's images and kept
    with them."""
    target = sifs.x86.parent / LUMI_SIF
    recipe = ensure_base(in_root)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            _log(f"reusing {target}")
            return target
        scratch = CACHE / f"building-{target.stem}-{user}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        os.chown(scratch, user, user)
        partial = scratch / target.name
        argv = ["make", "--no-print-directory", "build-lumi", f"LUMI_BASE_SIF={lumi_base(recipe, as_user, user)}",
                f"LUMI_SIF={partial}"]
        started = time.monotonic()
        checked(as_user([*argv, f"BUILD_FLAGS={TEST_BUILD_FLAGS}", *build_scratch(scratch / ".apptainer-build")]),
                "the LUMI image (make build-lumi)", CACHE / "logs" / f"{target.stem}.log")
        _log(f"{target.name}: {time.monotonic() - started:.0f} s")
        partial.rename(target)
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def arm64_base(in_root) -> Path:
    """An offline stand-in for Olivia's pre-pulled NGC SIF: an arm64 Debian, unpacked by
    `debootstrap --foreign` (no arm64 program runs here), made a SIF by the real
    `apptainer build` as root (a directory with no %post needs no container). Cached by recipe."""
    mirror = debian_mirror()
    key = hashlib.sha256(json.dumps(["arm64", "bookworm", mirror, RECIPE_VERSION]).encode()).hexdigest()[:16]
    sif = CACHE / f"base-arm64-{key}.sif"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if sif.exists():
            return sif
        tree = CACHE / f"base-arm64-{key}"
        shutil.rmtree(tree, ignore_errors=True)
        logs = CACHE / "logs"
        logs.mkdir(exist_ok=True)
        run_step(["debootstrap", "--foreign", "--arch=arm64", "--variant=minbase", "bookworm", tree, mirror],
                 "debootstrap --foreign --arch=arm64", logs / "debootstrap-arm64.log")
        # An image pulled from a registry has no device nodes (OCI layers carry none), and
        # an unprivileged unsquashfs could not make them.
        for entry in (tree / "dev").iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        partial = sif.with_suffix(".partial")
        checked(in_root(["apptainer", "build", "--force", *BASE_SQUASHFS, partial, f"{tree}/"]),
                "the arm64 base SIF (apptainer build)",
                logs / "base-arm64-sif.log")
        partial.rename(sif)
        shutil.rmtree(tree)
    return sif


def build(rebuild_base: bool = False) -> str:
    """The Charliecloud project image's name in STORAGE (the RunAI pod path), built on the
    cached base; one build at a time."""
    recipe = ensure_base(rebuild_base=rebuild_base)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ch_image("build", "--no-cache", "--build-arg", f"BASE_IMAGE={recipe.tag}",
                 *empty_default_arguments((REPO / DOCKERFILE).read_text()), "-t", IMAGE_NAME,
                 "-f", str(REPO / DOCKERFILE), str(REPO), step=f"ch-image build {DOCKERFILE}",
                 log=CACHE / "logs" / "build.log")
    return IMAGE_NAME


def charliecloud_copy(root: Path, name: str = IMAGE_NAME) -> Path:
    """A test's own view of the Charliecloud image: a hard-linked copy (seconds, no data
    copied), so the mount points a test creates never leak into another test."""
    shutil.rmtree(root, ignore_errors=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # never a copy of an image that a build is replacing
        run_step(["cp", "-al", STORAGE / "img" / name, root], f"hard-linked copy of {name}", root.parent / "copy.log")
    return root


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
