"""The full model's DDP buckets, read from a recording comm hook on two gloo ranks: the
all-reduce starts with the head's gradients and walks back to the stem, so it overlaps backward."""

from ddp_buckets import buckets
from ddp_train.recipe.model import WideResNet


def test_full_model_buckets_fire_head_first_stem_last_within_the_cap():
    fired = buckets(width=1.0, cap_mb=25.0)["fired"]
    parameters = sum(p.numel() for p in WideResNet(100, 1.0).parameters())
    assert sum(b["bytes"] for b in fired) == 4 * parameters  # 68.7 MB of fp32 gradients
    assert [b["index"] for b in fired] == list(range(len(fired)))
    assert fired[0]["first"] == "head.bias" and fired[-1]["last"] == "stem.0.weight"
    largest_tensor = 640 * 640 * 9 * 4
    assert all(b["bytes"] <= 25 * 2**20 + largest_tensor for b in fired)
    assert len(fired) == 3
