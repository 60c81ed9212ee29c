"""The README's RunAI block, build to resume, run as a reader runs it, with the CLIs stood in.

The block is run whole by bash from the repository root, its placeholders filled as the text
above it says (`<project>`, `<user>`, `<tag>`; `<run>` with the name the submit printed), with
the RunAI CLI v1's stand-in (tests/bats/stubs/runai: its documented flags only, a name in use
refused) and a docker stand-in that takes only the words `docker login`, `build` and `push` of
the block need, and only in that order.
"""

from __future__ import annotations

import os
import re
import subprocess

import documented_blocks
from definitions_paths import REPO

README = REPO / "README.md"
SUBMIT = REPO / "runai" / "submit.sh"
RUNAI_STAND_IN = REPO / "tests" / "bats" / "stubs" / "runai"
PLACEHOLDERS = {"<project>": "mlo", "<user>": "alice", "<tag>": "v1", "<uid>": "224954", "<gid>": "83070"}
POD_SCRIPT = REPO / "runai" / "pod.sh"

# docker(1) for the block (tests/stand_ins/docker.sh): `login HOST`, `build --platform linux/amd64 -f FILE
# -t TAG .`, `push TAG` of a TAG built before; anything else fails.
DOCKER_STAND_IN = REPO / "tests" / "stand_ins" / "docker.sh"


def runai_block() -> str:
    blocks = re.findall(r"^```\n(.*?)^```$", README.read_text(), re.M | re.S)
    found = [block for block in blocks if "runai/submit.sh" in block and "docker build" in block]
    assert len(found) == 1, "the README has one RunAI block, build to resume"
    return found[0]


def test_the_block_goes_build_push_stage_submit_logs_resume_in_that_order():
    lines = [line for line in runai_block().splitlines() if line and not line.startswith("#")]
    steps = [next(i for i, line in enumerate(lines) if re.search(pattern, line)) for pattern in
             (r"^docker build ", r"^docker push ", r"^export RUNAI_RUN_AS=", r"^runai/submit\.sh --download$",
              r"^\S*=.* runai/submit\.sh --epochs", r"^runai logs <run>", r"^RUNAI_RESUME=<run> runai/submit\.sh ")]
    assert steps == sorted(steps), lines


def staging_line(block: str) -> str:
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    found = [line for line in lines if line.endswith("runai/submit.sh --download")]
    assert len(found) == 1, block
    return found[0]


def test_a_pod_without_the_data_quotes_the_blocks_staging_command(tmp_path):
    # What the RCP pods say when the claim has no CIFAR-100: the command both README blocks stage it with.
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO / "entrypoints"), "DDP_DATA_DIR": str(tmp_path / "data"),
           "DDP_RUN_DIR": str(tmp_path / "run")}
    done = subprocess.run(["bash", str(POD_SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    error = done.stderr.splitlines()[-1]
    assert error.startswith(f"pod: error: {tmp_path}/data/cifar-100-python lacks train, test, meta: ")
    quick_start = documented_blocks.quick_start("RCP (RunAI)").text
    for block in (runai_block(), quick_start):
        assert f": {staging_line(block)} (one pod runs python3 -m ddp_contract download {tmp_path}/data)" in error
    assert "runai submit ..." not in error


def test_the_missing_image_error_quotes_the_blocks_build_and_push():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNAI_")}
    done = subprocess.run(["bash", str(SUBMIT)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    block = runai_block()
    image = re.search(r"^export RUNAI_IMAGE=(\S+)$", block, re.M).group(1)
    build = re.search(r"^docker build (.*) -t \"\$\{RUNAI_IMAGE\}\" \.$", block, re.M).group(1)
    assert f"docker build {build} -t {image} . && docker push {image}" in done.stderr
    assert "docker login ic-registry.epfl.ch" in done.stderr and "docker login ic-registry.epfl.ch" in block


def test_the_block_runs_as_written_and_resumes_the_run_it_submitted(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "runai").symlink_to(RUNAI_STAND_IN)
    (bin_dir / "docker").symlink_to(DOCKER_STAND_IN)
    state = tmp_path / "runai-state"
    script = runai_block()
    for placeholder, value in PLACEHOLDERS.items():
        script = script.replace(placeholder, value)
    # `<run>` is what the training's submit printed: the stand-in's second workload, the new run (the
    # first is the staging pod's).
    script = script.replace("<run>", f'"$(sed -n 2p {state}/workloads)"')
    assert "<" not in script.replace("<<", ""), f"a placeholder the README does not explain: {script}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNAI_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", RUNAI_FAKE_CLI="v1", RUNAI_FAKE_STATE=str(state),
               DOCKER_CALLS=str(tmp_path / "docker.calls"))

    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    image = "ic-registry.epfl.ch/mlo/ddp-train:v1"
    assert (tmp_path / "docker.calls").read_text().splitlines() == [
        "docker login ic-registry.epfl.ch",
        f"docker build --platform linux/amd64 -f containers/Dockerfile -t {image} .",
        f"docker push {image}"]
    staging, new_run, resumed = state.joinpath("workloads").read_text().split()
    assert re.fullmatch(r"ddp-train-\d{8}-\d{6}-[a-z0-9]{4}", new_run) and resumed != new_run
    # The staging pod: the image, the claim at its mount point, as the user, the download into the data dir.
    stage = state.joinpath(f"argv-{staging}").read_text().split("\0")[:-1]
    assert stage[:3] == ["submit", "--name", staging]
    assert stage[stage.index("--existing-pvc") + 1] == "claimname=runai-mlo-alice-scratch,path=/mloscratch"
    assert stage[stage.index("--run-as-uid"):stage.index("--run-as-uid") + 4] == ["--run-as-uid", "224954",
                                                                                  "--run-as-gid", "83070"]
    assert stage[stage.index("--"):] == ["--", "python3", "-m", "ddp_contract", "download", "/mloscratch/homes/alice/data"]
    assert f"staging CIFAR-100 into /mloscratch/homes/alice/data (claim runai-mlo-alice-scratch) in one pod, workload {staging}" in done.stderr
    assert f"runai/submit.sh: a new run, {new_run}, in /mloscratch/homes/alice/runs/{new_run}" in done.stderr
    assert f"runai stand-in: logs of {new_run}" in done.stdout
    assert (f"runai/submit.sh: continuing run {new_run} in /mloscratch/homes/alice/runs/{new_run}, "
            f"as workload {resumed}") in done.stderr
    argv = state.joinpath("argv").read_text().split("\0")[:-1]
    assert argv[:3] == ["submit-dist", "pytorch", "--name"] and argv[3] == resumed
    assert argv[argv.index("-i") + 1] == image
    assert argv.count("--existing-pvc") == 1
    assert argv[argv.index("--existing-pvc") + 1] == "claimname=runai-mlo-alice-scratch,path=/mloscratch"
    assert f"DDP_RUN_DIR=/mloscratch/homes/alice/runs/{new_run}" in argv
    assert argv[argv.index("--"):] == ["--", "/opt/ddp/runai/pod.sh", "--resume", "--epochs", "80"]
    assert argv[argv.index("--run-as-uid") + 1] == "224954" and argv[argv.index("--run-as-gid") + 1] == "83070"
