"""`image-cnn`: a small ResNet trained from PNG files decoded and augmented on the CPU.

The images are written once, deterministically, into a cache directory: ten classes
(five shapes x two colour families) at random positions, sizes and hues over noise, so the
loss really falls and the input pipeline (PNG decode, random crop + flip, normalise) costs
real CPU time in the dataloader workers.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import nn
from torch.utils.data import Dataset

from trainables.workloads.base import BuildContext, Workload, ensure_cached
from trainables.workloads.declared import ImageCnnParams as Params

logger = logging.getLogger(__name__)

NUM_CLASSES = 10
_SHAPES = ("circle", "square", "triangle", "cross", "ring")
_MEAN = torch.tensor([0.5, 0.5, 0.5]).view(3, 1, 1)
_STD = torch.tensor([0.25, 0.25, 0.25]).view(3, 1, 1)
_FORMAT_VERSION = 1  # bump when the generator changes, so old caches are not reused


# --- data ----------------------------------------------------------------------------


def _draw_image(rng: np.random.Generator, label: int, size: int) -> Image.Image:
    shape, warm = _SHAPES[label % 5], label >= 5
    noise = rng.integers(0, 80, size=(size, size, 3), dtype=np.uint8)
    img = Image.fromarray(noise, "RGB")
    draw = ImageDraw.Draw(img)
    hue = rng.uniform(0, 0.15) if warm else rng.uniform(0.45, 0.7)
    colour = tuple(int(255 * c) for c in _hsv(hue, rng.uniform(0.6, 1.0), rng.uniform(0.7, 1.0)))
    r = rng.uniform(0.2, 0.35) * size
    cx, cy = rng.uniform(r, size - r, size=2)
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    elif shape == "cross":
        w = r / 3
        draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=colour)
        draw.rectangle((cx - w, cy - r, cx + w, cy + r), fill=colour)
    else:
        draw.ellipse(box, outline=colour, width=max(2, int(r / 3)))
    return img


def _hsv(h: float, s: float, v: float) -> tuple[float, float, float]:
    i = int(h * 6) % 6
    f = h * 6 - math.floor(h * 6)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    return [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i]


def ensure_image_files(params: Params, data_dir: str, seed: int) -> Path:
    """Write the PNG files once per (params, seed) and node."""
    root = Path(data_dir) / (
        f"image-cnn-v{_FORMAT_VERSION}-s{params.image_size}"
        f"-n{params.num_train_images}-{params.num_val_images}-seed{seed}"
    )

    def write(tmp: Path) -> None:
        rng = np.random.default_rng(seed)
        for split, count in (("train", params.num_train_images), ("val", params.num_val_images)):
            (tmp / split).mkdir()
            for i in range(count):
                label = int(rng.integers(NUM_CLASSES))
                _draw_image(rng, label, params.image_size).save(tmp / split / f"{i:06d}_{label}.png")
        logger.info("wrote %d+%d images to %s", params.num_train_images, params.num_val_images, root)

    return ensure_cached(root, write)


class ImageFolderDataset(Dataset[tuple[torch.Tensor, int]]):
    """Decodes a PNG per item; train split adds random crop (pad 4) and horizontal flip."""

    def __init__(self, folder: Path, train: bool) -> None:
        self.files = sorted(folder.glob("*.png"))
        self.labels = [int(f.stem.split("_")[1]) for f in self.files]
        self.train = train

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[index]) as img:
            x = torch.from_numpy(np.asarray(img.convert("RGB"), dtype=np.uint8).copy())
        x = x.permute(2, 0, 1).float().div_(255)
        if self.train:
            size = x.shape[-1]
            x = F.pad(x, (4, 4, 4, 4), mode="reflect")
            i, j = torch.randint(0, 9, (2,)).tolist()
            x = x[:, i : i + size, j : j + size]
            if torch.rand(()) < 0.5:
                x = x.flip(-1)
        return (x - _MEAN) / _STD, self.labels[index]


# --- model ---------------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, width: int, depth: int, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        blocks: list[nn.Module] = []
        c_in = width
        for stage in range(3):
            c_out = width * 2**stage
            for b in range(depth):
                blocks.append(_Block(c_in, c_out, stride=2 if stage > 0 and b == 0 else 1))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


UNIT = "samples"


def build(params: Params, ctx: BuildContext) -> Workload:
    root = ensure_image_files(params, ctx.data_dir, ctx.seed)
    return Workload(
        model=SmallResNet(params.width, params.depth),
        train_dataset=ImageFolderDataset(root / "train", train=True),
        val_dataset=ImageFolderDataset(root / "val", train=False),
        loss_fn=F.cross_entropy,
        unit="samples",
        channels_last=True,
    )
