"""Flags -> TrainConfig: precedence, recipes, and the checks that reject unusable values."""

import pytest

import dataclasses
from typing import Literal, Optional

from ddp_train.config import DEMO_PRESET, GUIDE_RECIPE, RECIPES, TrainConfig, build_parser, config_from_args, option
from ddp_train.precision import resolve_precision
from ddp_train.resolve import check_world, peak_lr
from ddp_train.errors import TrainError


def test_guide_recipe_is_the_seeds_plain_sgd():
    config = config_from_args(["--recipe", "guide"])
    assert (config.base_lr, config.momentum, config.weight_decay) == (0.01, 0.9, 5e-4)
    assert (config.label_smoothing, config.warmup_epochs, config.schedule) == (0.0, 0.0, "constant")
    assert (config.ema_decay, config.tta, config.nesterov) == (0.0, False, False)


def test_guide_recipe_is_the_guides_train_ddp_py_value_for_value():
    # The Olivia guide's train_ddp.py (documentation.sigma2.no, pytorch_olivia/PyTorchMultiGpu):
    # argparse defaults --batch-size 512 (global, divided by the world size), --epochs 5,
    # --base-lr 0.01, --target-accuracy 0.85, --patience 2; SGD(lr=args.base_lr, ...) with no
    # scaling by the GPU count; torch.amp.autocast('cuda'), which is float16, with a GradScaler.
    config = config_from_args(["--recipe", "guide"])
    assert (config.batch_size, config.epochs, config.target_accuracy, config.patience) == (512, 5, 0.85, 2)
    assert config.precision == "fp16" and config.dropout == 0.01
    for world_size in (1, 4, 8):
        assert peak_lr(config, world_size) == 0.01
    # Its 4-GPU job passes --base-lr 0.04 and gets 0.04, not 0.16.
    assert peak_lr(config_from_args(["--recipe", "guide", "--base-lr", "0.04", "--batch-size", "1024"]), 4) == 0.04


def test_improved_recipe_is_the_default_and_each_change_is_a_flag():
    config = config_from_args([])
    assert config.recipe == "improved"
    assert config.label_smoothing > 0 and config.schedule == "cosine" and config.tta
    off = config_from_args(["--label-smoothing", "0", "--schedule", "constant", "--no-tta",
                            "--warmup-epochs", "0", "--no-nesterov"])
    assert (off.label_smoothing, off.schedule, off.tta, off.warmup_epochs, off.nesterov) == (
        0.0, "constant", False, 0.0, False)


def test_a_config_built_in_code_trains_as_ddp_train_with_no_flags_does():
    # A benchmark or a test that builds TrainConfig() gets the improved recipe, not a third set of values.
    assert TrainConfig() == config_from_args([])
    assert TrainConfig().recipe == "improved" and RECIPES["improved"] == {}


def test_every_field_is_a_flag_whose_help_is_declared_with_it():
    actions = {action.dest: action for action in build_parser()._actions if action.dest != "help"}
    fields = dataclasses.fields(TrainConfig)
    assert list(actions) == [field.name for field in fields]
    for field in fields:
        action = actions[field.name]
        flag = field.name.replace("_", "-")
        # A switch that is on (or decided by the run, None) by default has a --no- form that turns it
        # off; one that is off by default has none.
        negatable = "bool" in str(field.type) and field.default is not False
        assert action.option_strings == [f"--{flag}"] + ([f"--no-{flag}"] if negatable else [])
        if negatable:
            assert getattr(config_from_args([f"--no-{flag}"]), field.name) is False
        assert action.help == field.metadata["help"] and action.help.strip()
    assert actions["recipe"].choices == tuple(RECIPES)
    # The annotation's type reaches the flag: a float field refuses a word, an int field a fraction.
    with pytest.raises(TrainError, match="--width-scale"):
        config_from_args(["--width-scale", "wide"])
    with pytest.raises(TrainError, match="--epochs"):
        config_from_args(["--epochs", "2.5"])


def test_explicit_flag_beats_demo_preset_beats_recipe():
    demo = config_from_args(["--demo", "--recipe", "guide"])
    assert demo.width_scale == DEMO_PRESET["width_scale"]
    assert demo.base_lr == DEMO_PRESET["base_lr"] != GUIDE_RECIPE["base_lr"]
    explicit = config_from_args(["--demo", "--epochs", "7", "--base-lr", "0.3"])
    assert (explicit.epochs, explicit.base_lr) == (7, 0.3)


def test_seed_flags_keep_their_meaning():
    config = config_from_args(["--batch-size", "1024", "--epochs", "100", "--base-lr", "0.04",
                               "--target-accuracy", "0.95", "--patience", "2"])
    assert (config.batch_size, config.epochs, config.base_lr) == (1024, 100, 0.04)
    assert (config.target_accuracy, config.patience) == (0.95, 2)


def test_unknown_precision_is_a_one_line_error():
    with pytest.raises(TrainError, match="precision"):
        config_from_args(["--precision", "fp8"])


@pytest.mark.parametrize("flag,value", [("--batch-size", "0"), ("--width-scale", "0"),
                                        ("--epochs", "-1"), ("--ema-decay", "1.5")])
def test_unusable_values_are_rejected(flag, value):
    with pytest.raises(TrainError, match=flag):
        config_from_args([flag, value])


def test_batch_not_divisible_by_world_size_names_both():
    config = config_from_args(["--batch-size", "10"])
    check_world(config, 5)
    with pytest.raises(TrainError, match="--batch-size 10 is not divisible by the world size 4"):
        check_world(config, 4)


def test_lr_scales_linearly_with_world_size_unless_disabled():
    assert peak_lr(config_from_args(["--base-lr", "0.01", "--lr-scaling", "world-size"]), 8) == pytest.approx(0.08)
    assert peak_lr(config_from_args(["--base-lr", "0.01", "--lr-scaling", "none"]), 8) == 0.01


@pytest.mark.parametrize("requested,device,bf16,expected", [
    ("auto", "cpu", False, "fp32"),  # a CPU that would emulate bf16 (precision.read_cpu_bf16)
    ("auto", "cpu", True, "bf16"),  # a CPU that computes bf16 natively
    ("auto", "cuda", True, "bf16"),
    ("auto", "cuda", False, "fp16"),
    ("fp16", "cuda", True, "fp16"),
    ("fp32", "cuda", True, "fp32"),
])
def test_precision_defaults_to_bf16_where_the_device_computes_it(requested, device, bf16, expected):
    assert resolve_precision(requested, device, bf16) == expected


def test_bf16_on_a_gpu_without_it_is_an_error():
    with pytest.raises(TrainError, match="fp16"):
        resolve_precision("bf16", "cuda", False)


@dataclasses.dataclass(frozen=True)
class _EveryKindOfField:
    """A field of each annotation a TrainConfig field may carry, declared as TrainConfig's are."""
    clip: Optional[float] = option(None, "an Optional[float]: None unless given")
    workers: Optional[int] = option(None, "an Optional[int]")
    layout: Literal["nchw", "nhwc"] = option("nchw", "a Literal: its values are the choices")
    mode: str = option("a", "a str with declared choices", choices=("a", "b"))
    fused: bool = option(True, "a bool on by default: --fused/--no-fused")
    trace: bool = option(False, "a bool off by default: a switch")
    widths: tuple[int, ...] = option((16, 32), "a tuple: one or more ints")


def test_a_flag_parses_every_annotation_a_field_can_have():
    parser = build_parser(_EveryKindOfField)
    given = vars(parser.parse_args(["--clip", "0.5", "--workers", "3", "--layout", "nhwc", "--mode", "b",
                                    "--no-fused", "--trace", "--widths", "8", "16", "32"]))
    assert given == {"clip": 0.5, "workers": 3, "layout": "nhwc", "mode": "b", "fused": False, "trace": True,
                     "widths": [8, 16, 32]}
    assert isinstance(given["clip"], float)
    assert vars(parser.parse_args([])) == {}  # defaults stay the dataclass's
    for bad in (["--clip", "tight"], ["--workers", "2.5"], ["--layout", "nwhc"], ["--widths", "8", "x"]):
        with pytest.raises(TrainError):
            parser.parse_args(bad)


def test_a_field_whose_annotation_no_flag_can_parse_is_refused_by_name():
    @dataclasses.dataclass(frozen=True)
    class Odd:
        ratio: complex = option(1j, "no flag parses a complex")

    with pytest.raises(TypeError, match="ratio: a flag cannot parse"):
        build_parser(Odd)


def test_site_without_fabric_gate_is_refused_as_a_flag_that_would_do_nothing():
    with pytest.raises(TrainError, match="--site olivia names the profile --fabric-gate judges by, and this run "
                                         "has no --fabric-gate: pass both, or neither"):
        config_from_args(["--site", "olivia"])
    gated = config_from_args(["--fabric-gate", "--site", "olivia"])
    assert gated.fabric_gate and gated.site == "olivia"
    assert not config_from_args([]).fabric_gate  # only the job scripts ask for it
