"""make's venvs (tools/make_venv.py): the demo takes PyTorch's CPU-only build where no NVIDIA GPU is, falls
back to the default build in one line where that index cannot be reached, and every step says itself."""
from __future__ import annotations

import functools
import http.server
import os
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

import make_venv as venv_steps  # tools/make_venv.py, on pyproject's pythonpath

REPO = Path(__file__).resolve().parents[3]
TOOL = REPO / "tools" / "make_venv.py"
assert Path(venv_steps.__file__).resolve() == TOOL


def machine(**given) -> venv_steps.Machine:
    facts = dict(nvidia_gpu=False, cpu_index=venv_steps.CPU_INDEX, cpu_index_reachable=True,
                 full_venv_current=False, torch_build="")
    return venv_steps.Machine(**{**facts, **given})


def torch_step(plan: venv_steps.Plan) -> venv_steps.Step:
    return next(step for step in plan.steps if "torch==2.14.1" in step.argv)


def test_without_a_gpu_the_demo_takes_the_cpu_only_build_and_no_test_packages(tmp_path):
    plan = venv_steps.decide("demo", tmp_path / ".venv", "python3", machine())

    step = torch_step(plan)
    assert step.argv[-4:] == ("--extra-index-url", venv_steps.CPU_INDEX, "torch==2.14.1", "torchvision==0.29.1")
    assert step.long and "CPU-only" in step.title
    assert plan.steps[-1].argv[-1] == ".[train,plots]"  # no pytest, hypothesis, spython: the demo needs none
    assert plan.stamp == ".demo-installed"


def test_an_unreachable_cpu_index_falls_back_to_the_default_build_in_one_line(tmp_path):
    plan = venv_steps.decide("demo", tmp_path / ".venv", "python3", machine(cpu_index_reachable=False))

    assert "--extra-index-url" not in torch_step(plan).argv
    assert plan.note.startswith(f"no NVIDIA GPU here, but PyTorch's CPU-only index {venv_steps.CPU_INDEX} cannot "
                                "be reached")
    assert "\n" not in plan.note and "TORCH_CPU_INDEX" in plan.note


@pytest.mark.parametrize("given", [dict(nvidia_gpu=True), dict(cpu_index="")], ids=["a GPU", "index turned off"])
def test_a_gpu_or_an_empty_index_setting_takes_the_default_build(given, tmp_path):
    plan = venv_steps.decide("demo", tmp_path / ".venv", "python3", machine(**given))
    assert "--extra-index-url" not in torch_step(plan).argv


def test_the_tests_venv_serves_the_demo_as_it_is(tmp_path):
    plan = venv_steps.decide("demo", tmp_path / ".venv", "python3", machine(full_venv_current=True))
    assert plan.steps == () and "make venv" in plan.note


def test_the_tests_venv_replaces_a_demos_cpu_only_torch(tmp_path):
    # `torch==2.14.1` is satisfied by 2.14.1+cpu, so only a forced reinstall brings back the default build
    # (Triton, NCCL) that the tests use.
    plan = venv_steps.decide("full", tmp_path / ".venv", "python3", machine(torch_build="2.14.1+cpu"))
    assert "--force-reinstall" in torch_step(plan).argv and "--extra-index-url" not in torch_step(plan).argv
    assert plan.steps[-1].argv[-1] == ".[train,test]" and plan.stamp == ".installed"
    default = venv_steps.decide("full", tmp_path / ".venv", "python3", machine(torch_build="2.14.1+cu130"))
    assert "--force-reinstall" not in torch_step(default).argv


def wheel(directory: Path, name: str, version: str) -> Path:
    """A minimal wheel (PEP 427: the .dist-info's METADATA, WHEEL and RECORD) of `name` at `version`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return path


def simple_index(root: Path, wheels: dict) -> Path:
    """A PEP 503 simple index: <root>/<project>/index.html linking each of its files."""
    for project, versions in wheels.items():
        page = root / project
        files = [wheel(page, project, version) for version in versions]
        (page / "index.html").write_text("".join(f'<a href="{f.name}">{f.name}</a>\n' for f in files))
    return root


@pytest.fixture
def served(tmp_path):
    """A directory served over HTTP on loopback: the URL of its root."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_real_pip_takes_the_cpu_only_wheel_under_a_machines_cap(served, tmp_path):
    # What the CPU step's options do with pip itself: the default index has the plain 2.14.1 (the CUDA
    # build's version), the CPU index 2.14.1+cpu, and a constraints file caps torch at 2.14.1 as on a
    # machine whose pip configuration does: pip downloads the +cpu wheel.
    root, url = served
    simple_index(root, {"torch": ["2.14.1+cpu"], "torchvision": ["0.29.1+cpu"]})
    default = simple_index(tmp_path / "default", {"torch": ["2.14.1", "2.15.0"], "torchvision": ["0.29.1"]})
    (tmp_path / "constraints.txt").write_text("torch<=2.14.1\ntorchvision<=0.29.1\n")
    plan = venv_steps.decide("demo", tmp_path / ".venv", "python3", machine(cpu_index=url))
    argv = torch_step(plan).argv
    options = list(argv[argv.index("install") + 1:])

    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                           "--dest", str(tmp_path / "got"), "--index-url", default.as_uri(),
                           "-c", str(tmp_path / "constraints.txt"), *options],
                          env={**os.environ, "PIP_CONFIG_FILE": os.devnull}, capture_output=True, text=True,
                          timeout=300)

    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "got").iterdir()) == [
        "torch-2.14.1+cpu-py3-none-any.whl", "torchvision-0.29.1+cpu-py3-none-any.whl"]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def dry_run(mode: str, venv: Path, cpu_index: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), mode, str(venv), "--dry-run"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "TORCH_CPU_INDEX": cpu_index})


@pytest.mark.skipif(venv_steps.nvidia_gpu_present(), reason="this machine has an NVIDIA GPU: the demo takes the "
                                                           "default build whatever the index")
def test_the_demos_plan_asks_the_cpu_index_itself(served, tmp_path):
    root, url = served
    (root / "torch").mkdir()
    (root / "torch" / "index.html").write_text("")

    answered = dry_run("demo", tmp_path / ".venv", url)
    refused = dry_run("demo", tmp_path / ".venv", f"http://127.0.0.1:{closed_port()}/")

    assert answered.returncode == 0 and refused.returncode == 0, answered.stderr + refused.stderr
    assert f"--extra-index-url {url} torch==2.14.1" in answered.stdout
    assert "cannot be reached" in refused.stdout.splitlines()[0]
    assert "--extra-index-url" not in refused.stdout


def test_each_step_says_itself_and_a_failed_one_stops_without_the_stamp(tmp_path, capsys):
    ok = venv_steps.Step("a short step", (sys.executable, "-c", "pass"))
    long = venv_steps.Step("a long step", (sys.executable, "-c", "pass"), long=True)
    failing = venv_steps.Step("a failing step", (sys.executable, "-c", "raise SystemExit(3)"))

    assert venv_steps.carry_out(venv_steps.Plan((ok, long), "why", ".demo-installed"), tmp_path) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[:3] == ["venv: why", "venv: [1/2] a short step", "venv: [2/2] a long step ..."]
    assert said[3].startswith("venv: [2/2] done in ") and (tmp_path / ".demo-installed").exists()

    assert venv_steps.carry_out(venv_steps.Plan((failing,), "why", ".installed"), tmp_path) == 3
    assert capsys.readouterr().out.splitlines()[-1].startswith("venv: error: step 1 failed (exit 3): ")
    assert not (tmp_path / ".installed").exists()
