"""What a RunAI pod really runs: the image's ENTRYPOINT and the arguments runai/submit.sh gives.

The rule is RunAI's (Run:ai CLI reference, `runai submit-dist pytorch`): the words after
`--` are appended to the image's ENTRYPOINT as its arguments, unless `--command` is
given, in which case they replace the ENTRYPOINT (Kubernetes' `command` vs `args`,
"Define a Command and Arguments for a Container"). The ENTRYPOINT is read from the
generated Dockerfile, and the submit line from the real script with `runai` the CLI's stand-in
(tests/bats/stubs/runai: it takes only the flags its CLI documents, and a name not in use).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from definitions_paths import REPO

DOCKERFILE = REPO / "containers" / "Dockerfile"
SUBMIT = REPO / "runai" / "submit.sh"
RUNAI_STAND_IN = REPO / "tests" / "bats" / "stubs" / "runai"


def dockerfile_entrypoint(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith("ENTRYPOINT ")]
    assert len(lines) == 1, lines
    return json.loads(lines[0][len("ENTRYPOINT "):])


def dockerfile_files(text: str) -> set[str]:
    """Container paths the image gets from ADD/COPY lines."""
    return {line.split()[-1] for line in text.splitlines() if re.match(r"^(ADD|COPY) ", line)}


def pod_argv(entrypoint: list[str], runai_argv: list[str]) -> list[str]:
    """RunAI's rule: after `--` is the command with --command, else arguments to the ENTRYPOINT."""
    cut = runai_argv.index("--")
    flags, after = runai_argv[:cut], runai_argv[cut + 1:]
    return after if "--command" in flags else entrypoint + after


@pytest.fixture
def submitted(tmp_path):
    """Run runai/submit.sh with the RunAI CLI v1's stand-in on PATH; the argv it took (NUL-safe)."""
    state = tmp_path / "runai"
    stub = tmp_path / "bin" / "runai"
    stub.parent.mkdir()
    stub.symlink_to(RUNAI_STAND_IN)

    def submit(*trainer_args: str, **env: str) -> list[str]:
        run_env = {k: v for k, v in os.environ.items() if not k.startswith("RUNAI_")}
        run_env.update(PATH=f"{stub.parent}{os.pathsep}{os.environ['PATH']}",
                       RUNAI_IMAGE="registry.example/ddp-train:0.1", RUNAI_DATA_PVC="scratch",
                       RUNAI_RUN_PVC="scratch", RUNAI_RUN_AS="1000:1000", RUNAI_FAKE_CLI="v1",
                       RUNAI_FAKE_STATE=str(state), **env)
        done = subprocess.run(["bash", str(SUBMIT), *trainer_args], env=run_env,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return (state / "argv").read_text().split("\0")[:-1]

    return submit


def test_each_pod_runs_the_pod_script_not_ddp_launch_with_it_as_an_argument(submitted):
    text = DOCKERFILE.read_text()
    argv = pod_argv(dockerfile_entrypoint(text), submitted("--epochs", "5"))

    assert argv == ["/opt/ddp/runai/pod.sh", "--epochs", "5"]
    assert argv[0] in dockerfile_files(text), "the pod script must be baked into the image"


def test_trainer_arguments_reach_the_pod_script_word_for_word(submitted):
    argv = pod_argv(dockerfile_entrypoint(DOCKERFILE.read_text()),
                    submitted("--batch-size", "1 024", "--", "--run-dir", "/mnt/runs/a b"))

    assert argv[1:] == ["--batch-size", "1 024", "--", "--run-dir", "/mnt/runs/a b"]


def test_pods_get_a_large_shared_memory_unless_turned_off(submitted):
    assert "--large-shm" in submitted()
    assert "--large-shm" not in submitted(RUNAI_LARGE_SHM="0")


def test_the_rule_itself_appends_to_the_entrypoint_without_command():
    # The defect this guards against: without --command the pod ran
    # `ddp-launch /opt/ddp/runai/pod.sh ...`, which ddp-launch rejects with exit 2.
    assert pod_argv(["ddp-launch"], ["submit-dist", "--", "/opt/ddp/runai/pod.sh"]) == \
        ["ddp-launch", "/opt/ddp/runai/pod.sh"]


@pytest.mark.parametrize("after", [["bash", "-c", "sleep infinity"], ["/opt/ddp/runai/pod.sh", "--epochs", "5"]])
def test_a_command_given_without_runais_command_flag_names_that_flag(after):
    # RCP's own example: `runai submit-dist pytorch ... -- bash -c "sleep infinity"` without
    # --command. The pod then runs the image's ENTRYPOINT with these words as its arguments.
    argv = pod_argv(dockerfile_entrypoint(DOCKERFILE.read_text()), ["submit-dist", "pytorch", "--", *after])
    assert argv[0] == "ddp-launch"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO / "entrypoints"),
           "KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "RANK": "0"}  # set in every pod
    done = subprocess.run([sys.executable, "-m", "ddp_launch", *argv[1:]], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "add RunAI's --command (runai submit-dist pytorch ... --command -- " in done.stderr
    assert "unrecognized arguments" not in done.stderr
    # Trainer flags after RunAI's `--` reach ddp-launch too: what trains is the pod script, with --command.
    assert done.stderr.rstrip().endswith("to train, submit with --command -- /opt/ddp/runai/pod.sh and your trainer "
                                         "flags (runai/submit.sh does)")


def test_trainer_flags_given_without_runais_command_flag_say_how_a_pod_trains_not_to_put_them_after_dashes():
    # They were after RunAI's `--` already: ddp-launch, the ENTRYPOINT, got them as its own flags.
    argv = pod_argv(dockerfile_entrypoint(DOCKERFILE.read_text()), ["submit-dist", "pytorch", "--", "--epochs", "5"])
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO / "entrypoints"),
           "KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "RANK": "0"}
    done = subprocess.run([sys.executable, "-m", "ddp_launch", *argv[1:]], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("ddp-launch: error: unrecognized arguments: --epochs 5 (in a pod ddp-launch is the "
                                  "image's ENTRYPOINT, and RunAI hands it the words after its `--` unless --command "
                                  "is given: to train, submit with --command -- /opt/ddp/runai/pod.sh")
    assert "put workload arguments after --" not in done.stderr


def test_outside_a_pod_a_stray_command_is_the_plain_flag_error():
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO / "entrypoints")}
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "bash", "-c", "true"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unrecognized arguments: bash -c true (put workload arguments after --)" in done.stderr


def pod_env(runai_argv: list[str]) -> dict[str, str]:
    """The variables `-e NAME=VALUE` puts in every pod (Run:ai CLI reference, runai submit-dist pytorch)."""
    flags = runai_argv[:runai_argv.index("--")]
    return dict(flags[i + 1].split("=", 1) for i, flag in enumerate(flags) if flag == "-e")


def test_a_new_submission_trains_in_a_run_dir_of_its_own_named_by_the_submit_time(submitted):
    # With the real `date`: the prefix, the UTC time and 4 random characters, the workload's name too,
    # so a prefix used before no longer leads the pods into the old run's checkpoint.
    argv = submitted("--epochs", "5", RUNAI_JOB_NAME="wrn")
    name = argv[argv.index("--name") + 1]
    assert re.fullmatch(r"wrn-\d{8}-\d{6}-[a-z0-9]{4}", name)
    assert pod_env(argv)["DDP_RUN_DIR"] == f"/mnt/runs/{name}"
    assert pod_argv(dockerfile_entrypoint(DOCKERFILE.read_text()), argv) == ["/opt/ddp/runai/pod.sh", "--epochs", "5"]


def test_resuming_names_the_earlier_run_and_asks_the_trainer_to_resume_it(submitted):
    argv = submitted("--epochs", "9", RUNAI_RESUME="wrn-20260101-120000-k3x9", RUNAI_RUN_DIR="/mloscratch",
                     RUNAI_DATA_DIR="/mloscratch", RUNAI_RUN_SUBDIR="homes/alice/runs", RUNAI_DATA_SUBDIR="homes/alice/data")
    assert pod_env(argv) == {"DDP_DATA_DIR": "/mloscratch/homes/alice/data",
                             "DDP_RUN_DIR": "/mloscratch/homes/alice/runs/wrn-20260101-120000-k3x9"}
    assert pod_argv(dockerfile_entrypoint(DOCKERFILE.read_text()), argv) == \
        ["/opt/ddp/runai/pod.sh", "--resume", "--epochs", "9"]
    assert argv.count("--existing-pvc") == 1  # one claim (RUNAI_*_PVC=scratch), mounted once at /mloscratch
