"""--inductor-levers: names to torch._inductor.config options, set before the model compiles."""

import functools

import pytest
import torch._inductor.config as inductor_config

from ddp_train.fast import levers
from ddp_train.config import TrainConfig, config_from_args
from ddp_train.errors import TrainError


def current(name):
    return functools.reduce(getattr, name.split("."), inductor_config)


@pytest.fixture
def restored_inductor_config():
    """apply() sets options for the process: put every lever's options back after the test."""
    names = [name for name, _ in levers.options(tuple(levers.LEVERS))]
    saved = {name: current(name) for name in names}
    yield
    for name, value in saved.items():
        *parents, leaf = name.split(".")
        setattr(functools.reduce(getattr, parents, inductor_config), leaf, value)


def test_every_lever_names_options_this_torch_has():
    # A misspelt option would make apply() refuse the lever on every torch; the GPU image's
    # older torch is checked by the same function at run time (missing).
    assert levers.missing(levers.options(tuple(levers.LEVERS))) == []


def test_auto_is_the_measured_cuda_defaults_on_cuda_and_nothing_on_cpu_or_uncompiled():
    assert levers.resolve("auto", "cuda", compiled=True) == levers.CUDA_DEFAULT
    assert levers.resolve("auto", "cpu", compiled=True) == ()
    assert levers.resolve("pdl,conv1x1-mm", "cuda", compiled=False) == ()
    assert levers.resolve("none", "cuda", compiled=True) == ()
    assert levers.resolve("pdl, conv1x1-mm", "cpu", compiled=True) == ("pdl", "conv1x1-mm")


@pytest.mark.parametrize("text, named", [("pdl,fast-mode", "unknown fast-mode"), (",", "empty")])
def test_an_unknown_or_empty_lever_list_is_a_one_line_error_listing_the_names(text, named):
    with pytest.raises(TrainError) as raised:
        config_from_args(["--inductor-levers", text])
    message = str(raised.value)
    assert named in message and "coop-reductions" in message and "\n" not in message


def test_the_flag_reaches_the_config_and_its_default_is_auto():
    assert TrainConfig().inductor_levers == "auto"
    assert config_from_args([]).inductor_levers == "auto"
    assert config_from_args(["--inductor-levers", "combo-kernels"]).inductor_levers == "combo-kernels"


def test_apply_sets_each_levers_options_for_the_compile(restored_inductor_config):
    levers.apply(("coop-reductions", "conv1x1-mm"))
    assert current("triton.cooperative_reductions") is True
    assert current("conv_1x1_as_mm") is True


def test_an_option_this_torch_lacks_is_refused_by_name_not_silently_off(monkeypatch, restored_inductor_config):
    monkeypatch.setitem(levers.LEVERS, "future", ("not in any torch", (("triton.warp_magic", True),)))
    with pytest.raises(TrainError, match=r"has no inductor option triton\.warp_magic.*--inductor-levers none"):
        levers.apply(("future",))
