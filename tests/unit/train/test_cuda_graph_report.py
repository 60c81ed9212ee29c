"""CUDA graphs are never off without a word: each rank's state after the warm-up and in the
summary, and inductor's reason in one line where they are off (ddp_train/fast/cudagraph_report.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from ddp_train.fast import cudagraph_report
from ddp_train.fast.cudagraph_report import GraphReport, GraphState, decide

# The frame format of an FX node's meta["stack_trace"] (torch/fx/traceback.py), which inductor
# appends to its mutation message after "Found from :".
BN_FRAME = ('  File "/opt/ddp-hpc/src/ddp_train/recipe/model.py", line 41, in forward\n'
            '    out = self.bn2(self.conv2(out))\n')


def inductors_mutation_message() -> str:
    """The message inductor builds for a graph that mutates an input it does not own: its own
    function, on a placeholder whose mutating use carries the frame above."""
    from torch._inductor.cudagraph_utils import PlaceholderInfo, get_mutation_stack_trace
    buffer = PlaceholderInfo("primals_5", None, [], BN_FRAME)
    return get_mutation_stack_trace([buffer, buffer], [0, 1])


@pytest.mark.parametrize("device,compiled,mode,expected", [
    ("cpu", True, "reduce-overhead", GraphState("not used", "CPU: CUDA graphs need a GPU")),
    ("cuda", False, "eager", GraphState("not used", "not compiled (--no-compile)")),
    ("cuda", True, "default", GraphState("not used", "--compile-mode default has none; "
                                                     "reduce-overhead and max-autotune have")),
])
def test_graphs_not_asked_for_say_why_not(device, compiled, mode, expected):
    assert decide(device, compiled, mode, (), 0, 0) == expected


def test_recorded_graphs_without_a_skip_are_on():
    assert decide("cuda", True, "reduce-overhead", (), 0, 6).text() == "on (6 graph(s) recorded)"


def test_inductors_skip_message_reaches_the_report_as_one_line():
    watch = cudagraph_report.SkipWatch.start()
    try:
        from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter
        log_cudagraph_skip_and_bump_counter(inductors_mutation_message())  # inductor's own call
    finally:
        watch.stop()
    assert watch.skips_counted() == 1
    state = decide("cuda", True, "reduce-overhead", watch.messages, watch.skips_counted(), 0)
    assert state.state == "off"
    assert state.text() == ("off: skipping cudagraphs due to mutated inputs (2 instances), "
                            "at model.py:41 in forward")
    assert "\n" not in state.text()


def test_a_stopped_watch_collects_nothing_more():
    watch = cudagraph_report.SkipWatch.start()
    watch.stop()
    logging.getLogger(cudagraph_report.SKIP_LOGGER).warning("skipping cudagraphs due to cpu device")
    assert watch.messages == []


def test_some_graphs_recorded_and_some_skipped_is_partly_with_the_reason():
    state = decide("cuda", True, "reduce-overhead", [inductors_mutation_message()], 1, 2)
    assert state.state == "partly"
    assert state.text().startswith("partly: 2 graph(s) recorded; skipping cudagraphs due to mutated inputs")


def test_a_counted_skip_with_the_log_off_still_says_off():
    # TORCH_LOGS can turn inductor's warnings off; its counter still counts.
    state = decide("cuda", True, "reduce-overhead", (), 3, 0)
    assert state.state == "off" and "counted 3 skipped graph(s)" in state.detail


def test_several_distinct_reasons_name_the_first_and_count_the_rest():
    messages = ["skipping cudagraphs due to cpu device (primals_1)", inductors_mutation_message(),
                "skipping cudagraphs due to cpu device (primals_1)"]
    state = decide("cuda", True, "max-autotune", messages, 3, 0)
    assert state.detail == "skipping cudagraphs due to cpu device (primals_1) (and 1 other reason(s))"


def test_nothing_recorded_and_nothing_said_is_unknown_not_on():
    assert decide("cuda", True, "reduce-overhead", (), 0, 0).state == "unknown"
    assert decide("cuda", True, "reduce-overhead", (), 0, None).state == "unknown"


@pytest.mark.parametrize("ranks,expected", [([0], "0"), ([0, 1, 2, 5], "0-2,5"), ([7, 3, 4], "3-4,7")])
def test_rank_ranges(ranks, expected):
    assert cudagraph_report.rank_ranges(ranks) == expected


def test_report_groups_ranks_that_agree_and_records_every_rank():
    on, off = GraphState("on", "4 graph(s) recorded"), GraphState("off", "skipping cudagraphs due to x")
    report = GraphReport((on, on, off, on))
    assert report.lines() == ("CUDA graphs, ranks 0-1,3: on (4 graph(s) recorded)",
                              "CUDA graphs, rank 2: off: skipping cudagraphs due to x")
    assert report.record()["cuda_graphs"][2] == {"rank": 2, "state": "off", "detail": "skipping cudagraphs due to x"}
    assert GraphReport((on,)).lines() == ("CUDA graphs: on (4 graph(s) recorded)",)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU; this machine has none")
def test_ddp_wrapped_batchnorm_model_stays_on_graphs_or_says_why(tmp_path):
    # BatchNorm under DDP with reduce-overhead: https://github.com/pytorch/pytorch/issues/139207
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from ddp_train.recipe.model import WideResNet
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        model = WideResNet(100, 1 / 8, 0.0).cuda().to(memory_format=torch.channels_last)
        ddp = DistributedDataParallel(model, device_ids=[0], gradient_as_bucket_view=True)
        watch = cudagraph_report.SkipWatch.start()
        forward = torch.compile(ddp, mode="reduce-overhead")
        x = torch.randn(64, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
        for _ in range(3):  # the trainer's warm-up passes with graphs (speed.warmup_passes)
            torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                forward(x).float().sum().backward()
        watch.stop()
        state = cudagraph_report.observe("cuda", 0, True, "reduce-overhead", watch)
    finally:
        dist.destroy_process_group()
    assert state.state in ("on", "off", "partly"), state
    if state.state != "on":
        assert "\n" not in state.text() and "skipping cudagraphs due to" in state.detail
