# One file of entry points; the logic lives in the Python packages and scripts.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON    ?= python3
VENV      ?= .venv
VPY       := $(VENV)/bin/python
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
DATA_DIR  ?= data
RUN_DIR   ?= runs/demo

.PHONY: help venv demo data test test-unit test-e2e test-bats lint sysdeps bench

help:
	@echo "make demo    run the main job locally (CPU, no cluster, no Apptainer)"
	@echo "make test    install what the tests need and run them all"
	@echo "make data    fetch CIFAR-100 into $(DATA_DIR) (login node, once)"
	@echo "make bench   launcher and trainer benchmarks, printed side by side"
	@echo "make build-olivia | build-x86 | build-cpu | dockerfile   container images"

# The venv is rebuilt only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet $(TORCH_PINS)
	$(VPY) -m pip install --quiet -e '.[train,test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/ddp-launch --mode local --cpu-workers 2 -- --demo --data-dir $(DATA_DIR) --run-dir $(RUN_DIR)

data: venv
	$(VENV)/bin/ddp-train --download --data-dir $(DATA_DIR)

# Debian packages the tests use; installed only when missing and we are root.
SYSDEPS_CMDS := bats shellcheck slurmctld slurmd munged ip
sysdeps:
	@missing=""; for c in $(SYSDEPS_CMDS); do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	[ -d /usr/lib/bats/bats-assert ] || missing="$$missing bats-assert"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages for:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      slurm-wlm munge bats bats-assert bats-support shellcheck iproute2 >/dev/null; \
	  else echo "warning: missing$$missing and not root; the tests that need them will skip" >&2; fi; \
	fi

lint: venv sysdeps
	shellcheck slurm/*.sh slurm/lib/*.sh runai/*.sh tests/e2e/cluster/*.sh

test-bats: sysdeps
	bats --recursive tests/bats

test-unit: venv
	$(VPY) -m pytest tests/unit

test-e2e: venv sysdeps
	$(VPY) -m pytest tests/e2e

# bats first, pytest last: its closing summary line is the run's verdict.
test: venv sysdeps lint test-bats
	$(VPY) -m pytest tests

bench: venv
	$(VPY) benchmarks/launch_overhead.py
	$(VPY) benchmarks/trainer_throughput.py
