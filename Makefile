# One file of entry points; the logic lives in the Python packages and scripts.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON    ?= python3
VENV      ?= .venv
VPY       := $(VENV)/bin/python
DATA_DIR  ?= data
# make data CIFAR_URL=...: a mirror of the official CIFAR-100 tarball (its MD5 is still checked)
CIFAR_URL ?=
RUN_DIR   ?= runs/demo

.PHONY: help venv demo data test suite-clock world-ahead test-unit test-e2e test-bats lint sysdeps bench bench-gpu e2e-image soak

help:
	@echo "make demo    run the main job locally (CPU, no cluster, no Apptainer)"
	@echo "make test    install what the tests need and run them all"
	@echo "make data    fetch CIFAR-100 into $(DATA_DIR) (login node, once)"
	@echo "make bench   launcher and trainer benchmarks, printed side by side (bench-gpu on a GPU node)"
	@echo "make soak    N faulty 2-node jobs on the test cluster (N=50 SEED=...), totals in docs/reliability.md"
	@echo "make build-olivia | build-lumi | build-x86 | build-cpu | dockerfile   container images"

# The venvs are rebuilt only when pyproject.toml or tools/make_venv.py changes (tools/make_venv.py: its steps, the
# pins, and the demo's CPU-only PyTorch where the machine has no NVIDIA GPU). `make venv` is the tests'.
$(VENV)/.installed: pyproject.toml tools/make_venv.py
	$(PYTHON) tools/make_venv.py full $(VENV)

$(VENV)/.demo-installed: pyproject.toml tools/make_venv.py
	$(PYTHON) tools/make_venv.py demo $(VENV)

venv: $(VENV)/.installed

# The demo's last lines are ddp-bench report's: the run's table, what it trained on, where the plots are.
demo: $(VENV)/.demo-installed
	$(VENV)/bin/ddp-launch --mode local --cpu-workers 2 -- --demo --data-dir $(DATA_DIR) --run-dir $(RUN_DIR)
	$(VENV)/bin/ddp-bench report $(RUN_DIR) --out $(RUN_DIR)/report

# The login node's own python3 is enough (3.6 on SLES 15): a standard-library downloader, no venv,
# no torch. Inside the image instead: apptainer exec IMAGE.sif ddp-train --download --data-dir DIR
data:
	PYTHONPATH="$(CURDIR)/entrypoints" $(PYTHON) -m ddp_contract download "$(DATA_DIR)" $(if $(CIFAR_URL),--url "$(CIFAR_URL)")

# Debian packages the tests use; installed only when missing and we are root.
# debootstrap builds the e2e tests' Debian sid root (the real Apptainer, SLURM) and test
# base; ch-image, ch-run (charliecloud) build and run the RunAI pods' image.
SYSDEPS_CMDS := bats shellcheck slurmctld slurmd munged ip ch-image ch-run debootstrap
sysdeps:
	@missing=""; for c in $(SYSDEPS_CMDS); do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	[ -d /usr/lib/bats/bats-assert ] || missing="$$missing bats-assert"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages for:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      slurm-wlm munge bats bats-assert bats-support shellcheck iproute2 charliecloud debootstrap >/dev/null; \
	  else echo "warning: missing$$missing and not root; the tests that need them will skip" >&2; fi; \
	fi

lint: venv sysdeps
	shellcheck slurm/*.sh slurm/lib/*.sh runai/*.sh tests/e2e/cluster/*.sh tests/e2e/cluster/twins/*.sh containers/*.sh tests/unit/doctor/data/gpu-health/bin/* tests/bats/stubs/*
	cd entrypoints && $(abspath $(VENV))/bin/vermin --target=3.6- --violations --no-tips $$(grep -v '^#' host-modules.txt)
	$(VENV)/bin/vermin --target=3.6- --violations --no-tips containers/base_image.py containers/image_help.py

test-bats: sysdeps
	bats --recursive tests/bats

test-unit: venv
	$(VPY) -m pytest tests/unit

test-e2e: venv sysdeps
	$(VPY) -m pytest $(E2E_ARGS) tests/e2e

# Not part of `make test`: N short 2-node jobs with faults drawn from SEED (random when unset,
# printed), on the namespace cluster under load; totals go to docs/reliability.md.
N    ?= 50
SEED ?=
soak: venv sysdeps
	PYTHONPATH=tests $(VPY) tests/e2e/soak.py --jobs $(N) $(if $(SEED),--seed $(SEED)) $(SOAK_ARGS)

# The e2e RunAI pods' image (ch-image, from containers/Dockerfile on a cached Debian + torch
# base); the tests build it themselves when needed, this only does it ahead of them.
e2e-image: venv sysdeps
	$(VPY) tests/e2e/e2e_image.py build

# tools/run_tests.py: the unit suite first, on two processes, with the bats suite beside it; then the e2e
# suite on E2E_WORKERS clusters side by side (pytest-xdist, each worker with a cluster of its own:
# tests/e2e/conftest.py worker_settings). The tests of a module that shares a module fixture (a twin,
# the spares' reference run) go to one worker together, every other test alone, the long ones first
# (tests/e2e/scheduling.py). The unit suite does not run beside the e2e one: both keep the 2 cores
# busy on their own (the time is the same either way), and beside three clusters at a load of 20 its
# subprocess tests waited minutes for a core. Every suite runs whatever another one said; the failures
# of all three are named again at the end, then each phase's minutes and CPU-seconds (suite-clock marks
# the start, before the venv and lint), and the last line is the verdict. The e2e world (a Debian root
# for the cluster, the test base: downloads and unpacking) starts once sysdeps has put debootstrap in,
# beside pip's install of the venv, which keeps one core busy for about two minutes: the world fills the other.
E2E_WORKERS ?= 3
E2E_ARGS = $(if $(filter-out 0 1,$(E2E_WORKERS)),-n $(E2E_WORKERS) --dist loadscope)
test: suite-clock sysdeps world-ahead venv lint
	@$(VPY) tools/run_tests.py --e2e-workers $(E2E_WORKERS)

suite-clock:
	@$(PYTHON) tools/run_tests.py --mark-start

world-ahead: sysdeps
	@$(PYTHON) tools/run_tests.py --start-world

bench: venv
	$(VPY) benchmarks/launch_overhead.py
	$(VPY) benchmarks/trainer_throughput.py
	$(VPY) benchmarks/rank_setup.py
	$(VPY) benchmarks/cpu_bf16.py --only step
	$(VPY) benchmarks/fabric_gate_cost.py

# On a GPU node: every variant (inductor levers, max-autotune, fused blocks) at the trainer's batch, beside the guide's pipeline.
bench-gpu: venv
	$(VPY) benchmarks/gpu_throughput.py --device cuda
	$(VPY) benchmarks/scaling_model.py

# ---------------------------------------------------------------------------
# Container images (images engineer). Each target says what it builds and where
# the SIF lands. Apptainer is needed only here; on clusters: module load apptainer.
# ---------------------------------------------------------------------------
.PHONY: build-olivia build-lumi build-x86 build-cpu build-olivia-job dockerfile

SIF_DIR          ?= .
APPTAINER        ?= apptainer
BUILD_FLAGS      ?= --fakeroot
IMAGE_VERSION    := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
GIT_COMMIT       := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
NGC_PYTORCH      ?= nvcr.io/nvidia/pytorch:25.06-py3
# A site's base image is data (containers/base-images.json, with its source): the SIF pre-pulled
# on the cluster when it exists (no registry pull), else the registry image it was made from.
base_image        = $(shell $(PYTHON) $(CURDIR)/containers/base_image.py $(1) $(2))
OLIVIA_BASE_SIF  ?= $(call base_image,olivia,sif)
OLIVIA_BASE_DOCKER ?= $(call base_image,olivia,docker)
OLIVIA_SIF       ?= $(SIF_DIR)/train-olivia-arm64.sif
LUMI_BASE_SIF    ?= $(call base_image,lumi,sif)
LUMI_BASE_DOCKER ?= $(call base_image,lumi,docker)
LUMI_SIF         ?= $(SIF_DIR)/train-lumi-x86_64.sif
X86_SIF          ?= $(SIF_DIR)/train-x86_64.sif
CPU_SIF          ?= $(SIF_DIR)/train-cpu.sif
OLIVIA_ACCOUNT   ?= $(SBATCH_ACCOUNT)
IMAGE_ARGS        = --build-arg VERSION=$(IMAGE_VERSION) --build-arg GIT_COMMIT=$(GIT_COMMIT)
# One definition for every GPU image; its build arguments pick the target (see its header).
GPU_DEF          := containers/gpu.def
# An image's %help is its site's (runtime, binds variable, GPU flag, srun options), from the site
# profile: `python3 containers/image_help.py SITE` prints those build arguments (the x86 image's, with
# no site, are gpu.def's defaults). `=`, not `:=`: read when a build needs them.
image_help        = $(or $(shell PYTHONPATH="$(CURDIR)/entrypoints" $(PYTHON) $(CURDIR)/containers/image_help.py $(1)),$(error containers/image_help.py $(1) printed nothing: see its error above))
OLIVIA_ARGS       = --build-arg ARCH=arm64 --build-arg SITE=olivia $(call image_help,olivia)
LUMI_ARGS         = --build-arg ARCH=amd64 --build-arg SITE=lumi $(call image_help,lumi)
X86_ARGS         := --build-arg ARCH=amd64

# Bases: the NGC image from its registry; the e2e tests swap in a local SIF
# (X86_BASE="--build-arg BOOTSTRAP=localimage --build-arg BASE_IMAGE=base.sif").
X86_BASE         ?= --build-arg BASE_IMAGE=$(NGC_PYTORCH)
CPU_BASE         ?=
# gpu.def's empty %arguments default (SITE=) is refused before Apptainer 1.3
# ("Templating cannot handle empty values", apptainer#1584).
APPTAINER_MIN    := 1.3

# Apptainer keeps pulled layers in ~/.apptainer/cache and unpacks builds in /tmp unless
# APPTAINER_CACHEDIR / APPTAINER_TMPDIR say otherwise (apptainer.org/docs/user/latest/build_env.html);
# the NGC base is ~20 GB unpacked and home quotas are small (apptainer#546: a 56 GB ~/.apptainer).
# Where they are unset, builds use BUILD_SCRATCH: $$USERWORK (Sigma2's work area), else $$SCRATCH,
# else SIF_DIR; containers/build-space.sh names them and checks the free space first.
BUILD_SCRATCH     ?= $(or $(USERWORK),$(SCRATCH),$(SIF_DIR))/.apptainer-build
BUILD_MIN_FREE_GB ?= 40
build-cpu: BUILD_MIN_FREE_GB = 8
build-olivia build-lumi build-x86 build-cpu: export APPTAINER_CACHEDIR := $(or $(APPTAINER_CACHEDIR),$(abspath $(BUILD_SCRATCH))/cache)
build-olivia build-lumi build-x86 build-cpu: export APPTAINER_TMPDIR := $(or $(APPTAINER_TMPDIR),$(abspath $(BUILD_SCRATCH))/tmp)

define need_apptainer
	@command -v $(APPTAINER) >/dev/null 2>&1 || { echo "error: '$(APPTAINER)' not found on PATH; on a cluster run 'module load apptainer', elsewhere install it (https://apptainer.org/docs/admin/main/installation.html)" >&2; exit 127; }
	@v="$$($(APPTAINER) --version 2>/dev/null | sed -n 's/^[a-z]* version \([0-9][0-9.]*\).*/\1/p')"; \
	 [ -n "$$v" ] && [ "$$(printf '%s\n' $(APPTAINER_MIN) "$$v" | sort -V | head -n 1)" = $(APPTAINER_MIN) ] \
	 || { echo "error: $(APPTAINER) $${v:-of unknown version} is older than $(APPTAINER_MIN), which containers/*.def need (apptainer#1584): 'module load apptainer/$(APPTAINER_MIN)' or newer" >&2; exit 2; }
	@$(CURDIR)/containers/build-space.sh "$(BUILD_MIN_FREE_GB)"
endef

# %test runs inside the image, so it is skipped when building arm64 on an x86_64 login node.
# Apptainer opens a SIF only when its architecture can run on the host (CompatibleWith in
# its image code: arm64 on amd64 needs binfmt_misc emulation), even for a build with no
# %post. So there the pre-pulled arm64 SIF is unpacked to a sandbox directory first
# (`apptainer sif list` finds its squashfs partition, `unsquashfs -o OFFSET` reads it in
# place: neither checks the architecture); built on that, the SIF is arm64 all the same.
# The ~20 GB sandbox goes in APPTAINER_TMPDIR, the scratch that build-space.sh has just checked
# and where Apptainer makes its own build sandbox ("Temporary Folders", build_env.html above),
# never in $TMPDIR or /tmp, which a login node keeps small.
build-olivia:
	$(need_apptainer)
	@set -e; notest=""; [ "$$(uname -m)" = aarch64 ] || notest="--notest"; \
	 if [ -f "$(OLIVIA_BASE_SIF)" ] && [ "$$(uname -m)" != aarch64 ]; then \
	   command -v unsquashfs >/dev/null || { echo "error: unsquashfs not found: install squashfs-tools (>= 4.5), or run 'make build-olivia-job' to build on a GH200 node" >&2; exit 127; }; \
	   unpacked="$$(mktemp -d "$$APPTAINER_TMPDIR/olivia-base.XXXXXX")"; trap 'rm -rf "$$unpacked"' EXIT; \
	   offset="$$($(APPTAINER) sif list "$(OLIVIA_BASE_SIF)" | awk -F'|' '/Squashfs/ { split($$4, at, "-"); print at[1] + 0; exit }')"; \
	   [ -n "$$offset" ] || { echo "error: $(OLIVIA_BASE_SIF) has no squashfs partition ('$(APPTAINER) sif list' shows its parts)" >&2; exit 2; }; \
	   rootfs="$$unpacked/$(basename $(notdir $(OLIVIA_BASE_SIF)))"; \
	   echo "unpacking $(OLIVIA_BASE_SIF) (arm64) to $$rootfs: this x86_64 host cannot open an arm64 SIF"; \
	   unsquashfs -no-xattrs -o "$$offset" -d "$$rootfs" "$(OLIVIA_BASE_SIF)" >/dev/null; \
	   base="--build-arg BOOTSTRAP=localimage --build-arg BASE_IMAGE=$$rootfs"; \
	 elif [ -f "$(OLIVIA_BASE_SIF)" ]; then base="--build-arg BOOTSTRAP=localimage --build-arg BASE_IMAGE=$(OLIVIA_BASE_SIF)"; \
	 else base="--arch arm64 --build-arg BOOTSTRAP=docker --build-arg BASE_IMAGE=$(OLIVIA_BASE_DOCKER)"; fi; \
	 echo "building $(GPU_DEF) for Olivia ($(OLIVIA_ARGS), $$base) -> $(OLIVIA_SIF)"; \
	 $(APPTAINER) build $(BUILD_FLAGS) $$notest $$base $(OLIVIA_ARGS) $(IMAGE_ARGS) "$(OLIVIA_SIF)" $(GPU_DEF)
	@echo "SIF: $(OLIVIA_SIF)"

# LUMI (MI250X GCDs, x86_64): gpu.def on the LUMI AI Factory's ROCm PyTorch image, which already
# carries RCCL's libfabric plugin. LUMI disables sudo and fakeroot, so building there "is, unfortunately,
# not in general possible" (https://docs.lumi-supercomputer.eu/software/containers/singularity/):
# this runs on a machine with Apptainer, from the Docker Hub copy of that image, and the SIF is
# copied to LUMI; where the LUMI SIF itself is readable, it is the base.
build-lumi:
	$(need_apptainer)
	@set -e; sif="$(LUMI_BASE_SIF)"; \
	 if [ -f "$$sif" ]; then base="--build-arg BOOTSTRAP=localimage --build-arg BASE_IMAGE=$$sif"; \
	 else base="--build-arg BOOTSTRAP=docker --build-arg BASE_IMAGE=$(LUMI_BASE_DOCKER)"; fi; \
	 echo "building $(GPU_DEF) for LUMI ($(LUMI_ARGS), $$base) -> $(LUMI_SIF)"; \
	 $(APPTAINER) build $(BUILD_FLAGS) $$base $(LUMI_ARGS) $(IMAGE_ARGS) "$(LUMI_SIF)" $(GPU_DEF)
	@echo "SIF: $(LUMI_SIF)"

build-x86:
	$(need_apptainer)
	@echo "building $(GPU_DEF) for x86_64 GPU nodes ($(X86_ARGS), $(X86_BASE)) -> $(X86_SIF)"
	$(APPTAINER) build $(BUILD_FLAGS) $(X86_BASE) $(X86_ARGS) $(IMAGE_ARGS) "$(X86_SIF)" $(GPU_DEF)
	@echo "SIF: $(X86_SIF)"

build-cpu:
	$(need_apptainer)
	@echo "building containers/cpu.def (CPU-only torch, native arch) -> $(CPU_SIF)"
	$(APPTAINER) build $(BUILD_FLAGS) $(CPU_BASE) $(IMAGE_ARGS) "$(CPU_SIF)" containers/cpu.def
	@echo "SIF: $(CPU_SIF)"

# Build on an aarch64 compute node instead (runs %test natively there).
build-olivia-job:
	@command -v sbatch >/dev/null 2>&1 || { echo "error: sbatch not found; run this on an Olivia login node" >&2; exit 127; }
	@echo "submitting a job that runs 'make build-olivia' on a GH200 node -> $(OLIVIA_SIF)"
	sbatch --job-name=build-olivia-sif --partition=accel --nodes=1 --gpus=1 --time=01:00:00 \
	  $(if $(OLIVIA_ACCOUNT),--account=$(OLIVIA_ACCOUNT)) --output=build-olivia-%j.out \
	  --wrap 'module load apptainer 2>/dev/null; make build-olivia OLIVIA_SIF=$(OLIVIA_SIF)'

# The x86_64 image as a Dockerfile for RunAI/Kubernetes; the build arguments stay ARGs.
dockerfile: venv
	@echo "generating containers/Dockerfile from $(GPU_DEF) (spython)"
	$(VPY) containers/dockerfile.py --def $(GPU_DEF) --build-arg VERSION=$(IMAGE_VERSION) $(X86_ARGS) -o containers/Dockerfile
