"""A model trained from image files in a folder, named by a relative path: `examples/image_folder.yaml`.

The folder has torchvision's `ImageFolder` layout, plus the class list::

    data/shapes/classes.txt            one class name a line (its line number is the label)
    data/shapes/train/<class>/*.png
    data/shapes/val/<class>/*.png

Make it once (PNG files drawn here, nothing downloaded), then sweep, both from the repo root::

    .venv/bin/python -m examples.image_folder data/shapes
    .venv/bin/sweeps run examples/image_folder.yaml

`params.root: data/shapes` is relative, and every rank resolves it as a plain script would: against
the directory `sweeps run` started in (inside `ray job submit --working-dir .`, the job's copy of
that directory on each node). The builder reads `classes.txt` and lists the files; each item is
opened by its relative path when the loader asks for it (in the rank or in a loader worker).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

from trainables import BuildContext, Workload, WorkloadError

PARAMS = {"root": "data/shapes", "width": 16}
CLASSES = ("disc", "square", "stripes", "ring")


class PngFolder(Dataset[tuple[torch.Tensor, int]]):
    """`folder/<class>/*.png`, labelled by the class's position in `classes`."""

    def __init__(self, folder: Path, classes: list[str]) -> None:
        self.items = [(path, label) for label, name in enumerate(classes) for path in sorted((folder / name).glob("*.png"))]
        if not self.items:
            raise WorkloadError(f"no PNG files under {folder}/<class>/ for classes {classes}: make them with "
                                f"`python -m examples.image_folder {folder.parent}`")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        with Image.open(path) as img:
            pixels = np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
        return torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255), label


def build(params: dict[str, Any], ctx: BuildContext) -> Workload:
    root = Path(params["root"])
    classes = (root / "classes.txt").read_text().split()  # a missing folder fails here, naming the directory
    width = int(params["width"])
    model = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, len(classes)),
    )
    return Workload(model=model, train_dataset=PngFolder(root / "train", classes),
                    val_dataset=PngFolder(root / "val", classes), loss_fn=F.cross_entropy)


def _draw(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size] / size
    cy, cx = rng.uniform(0.35, 0.65, 2)
    r = rng.uniform(0.2, 0.35)
    dist = np.hypot(yy - cy, xx - cx)
    mask = {"disc": dist < r, "square": np.maximum(abs(yy - cy), abs(xx - cx)) < r * 0.8,
            "stripes": np.sin(xx * rng.uniform(12, 20) + rng.uniform(0, 6)) > 0, "ring": abs(dist - r) < 0.07}[kind]
    colour, background = rng.uniform(0.5, 1.0, 3), rng.uniform(0.0, 0.3, 3)
    image = np.where(mask[..., None], colour, background) + rng.normal(0, 0.05, (size, size, 3))
    return (np.clip(image, 0, 1) * 255).astype(np.uint8)


def prepare(root: Path, num_per_class: int = 64, image_size: int = 24, seed: int = 0) -> Path:
    """Write the folder: `num_per_class` training and a quarter as many validation PNGs per class."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", num_per_class), ("val", max(1, num_per_class // 4))):
        for kind in CLASSES:
            folder = root / split / kind
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(_draw(kind, image_size, rng)).save(folder / f"{i:05d}.png")
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    return root


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m examples.image_folder", description="write the example's PNG folder")
    parser.add_argument("root", nargs="?", default=PARAMS["root"], help=f"where (default: {PARAMS['root']})")
    parser.add_argument("--num-per-class", type=int, default=64, help="training images per class (val: a quarter)")
    args = parser.parse_args()
    print(f"wrote {prepare(Path(args.root), args.num_per_class)}")
