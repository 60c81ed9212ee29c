"""Write a small, learnable dataset in CIFAR-100's exact on-disk format (tests, demo, benchmarks).

    python -m ddp_train.synthetic OUT_DIR --train N --test M [--seed S] [--classes K]

Each class has its own colour and low-frequency stripe pattern; every image adds a random
shift and noise, so a narrow network beats chance by a wide margin within a few CPU epochs.
numpy only (no torch), so it starts fast.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ddp_train.layout import DATASET_DIRNAME, NUM_CLASSES


def class_templates(num_classes: int, seed: int) -> np.ndarray:
    """One float32 3x32x32 template per class: a colour plus horizontal/vertical stripes."""
    rng = np.random.default_rng(seed)
    coords = np.arange(32, dtype=np.float32) / 32.0
    templates = np.empty((num_classes, 3, 32, 32), dtype=np.float32)
    for c in range(num_classes):
        colour = rng.uniform(50, 205, size=3).astype(np.float32)
        fy, fx = rng.integers(1, 4, size=2)
        py, px = rng.uniform(0, 2 * np.pi, size=2)
        # Stripes that are symmetric under a horizontal flip, so augmentation keeps the class.
        wave = (np.cos(2 * np.pi * fy * coords + py)[:, None]
                + np.cos(2 * np.pi * fx * (coords - 0.5 + 1 / 64))[None, :] * np.cos(px))
        signs = rng.choice([-1.0, 1.0], size=3).astype(np.float32)
        templates[c] = colour[:, None, None] + 30.0 * signs[:, None, None] * wave[None]
    return templates


def make_split(n: int, templates: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
    labels = rng.integers(0, templates.shape[0], size=n)
    images = templates[labels]
    shifts = rng.integers(-2, 3, size=(n, 2))
    for i, (dy, dx) in enumerate(shifts):
        images[i] = np.roll(images[i], (int(dy), int(dx)), axis=(1, 2))
    images = images + rng.normal(0.0, 20.0, size=images.shape).astype(np.float32)
    data = np.clip(images, 0, 255).astype(np.uint8).reshape(n, 3 * 32 * 32)
    return data, [int(x) for x in labels]


def _write_pickle_atomic(path: Path, obj: object) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(obj, f, protocol=2)  # the official files are protocol-2 pickles
    os.replace(tmp, path)


def write_dataset(out_dir: str | Path, train: int, test: int, seed: int = 0,
                  classes: int = NUM_CLASSES) -> Path:
    if not 1 <= classes <= NUM_CLASSES:
        raise ValueError(f"classes must be in 1..{NUM_CLASSES}, got {classes}")
    root = Path(out_dir) / DATASET_DIRNAME
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 1)
    templates = class_templates(classes, seed)
    names = [f"class_{c:03d}" for c in range(NUM_CLASSES)]
    _write_pickle_atomic(root / "meta", {
        "fine_label_names": names,
        "coarse_label_names": [f"superclass_{c:02d}" for c in range(20)],
    })
    for split, n in (("train", train), ("test", test)):
        data, labels = make_split(n, templates, rng)
        _write_pickle_atomic(root / split, {
            "filenames": [f"synthetic_{split}_{i:06d}.png" for i in range(n)],
            "batch_label": f"synthetic {split} set (seed {seed})",
            "fine_labels": labels,
            "coarse_labels": [label // 5 for label in labels],
            "data": data,
        })
    return root


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddp_train.synthetic", description=__doc__.splitlines()[0])
    p.add_argument("out_dir", help="writes OUT_DIR/cifar-100-python/{train,test,meta}")
    p.add_argument("--train", type=int, default=5000, help="training images (default: 5000)")
    p.add_argument("--test", type=int, default=1000, help="test images (default: 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--classes", type=int, default=NUM_CLASSES,
                   help=f"use labels 0..K-1 only (default: {NUM_CLASSES})")
    args = p.parse_args(argv)
    if args.train < 1 or args.test < 1 or not 1 <= args.classes <= NUM_CLASSES:
        p.error(f"--train and --test must be at least 1 and --classes in 1..{NUM_CLASSES}")
    root = write_dataset(args.out_dir, args.train, args.test, args.seed, args.classes)
    print(f"wrote {args.train} train and {args.test} test images to {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
