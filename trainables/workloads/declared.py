"""What each registered workload declares without importing model code: its fixed params and unit.

Torch-free on purpose: the service validates a spec (param names and types, the default
objective's unit) from these declarations alone, so `sweeps validate` never imports torch.
The workload modules import their `Params` from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageCnnParams:
    image_size: int = 32
    num_train_images: int = 1024
    num_val_images: int = 256
    width: int = 16  # channels of the first stage; doubled per stage
    depth: int = 1  # residual blocks per stage (3 stages)

    def __post_init__(self) -> None:
        if self.image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {self.image_size}")
        if self.num_train_images < 1 or self.num_val_images < 1:
            raise ValueError("num_train_images and num_val_images must be >= 1")
        if self.width < 1 or self.depth < 1:
            raise ValueError("width and depth must be >= 1")


@dataclass(frozen=True)
class MlpTabularParams:
    num_features: int = 16
    hidden: int = 64
    num_train_rows: int = 4096
    num_val_rows: int = 512

    def __post_init__(self) -> None:
        if min(self.num_features, self.hidden, self.num_train_rows, self.num_val_rows) < 1:
            raise ValueError("num_features, hidden, num_train_rows and num_val_rows must be >= 1")


@dataclass(frozen=True)
class Preset:
    n_layer: int
    n_head: int
    n_embd: int
    seq_len: int
    vocab_size: int  # padded to a multiple of 128
    num_train_tokens: int
    num_val_tokens: int


GPT_PRESETS: dict[str, Preset] = {
    "tiny": Preset(2, 4, 64, 64, 256, 1 << 17, 1 << 14),
    "gpt2-small": Preset(12, 12, 768, 1024, 50304, 1 << 22, 1 << 18),  # 124M params
    "gpt2-medium": Preset(24, 16, 1024, 1024, 50304, 1 << 22, 1 << 18),  # 350M params: the GPU memory stage's
}


@dataclass(frozen=True)
class GptLmParams:
    preset: str = "tiny"
    seq_len: int | None = None  # default: the preset's
    num_train_tokens: int | None = None
    num_val_tokens: int | None = None
    n_layer: int | None = None  # default: the preset's (a deeper or wider model: what a memory sweep varies)
    n_embd: int | None = None  # default: the preset's; a multiple of its n_head

    def __post_init__(self) -> None:
        if self.preset not in GPT_PRESETS:
            raise ValueError(f"preset {self.preset!r} is not one of {sorted(GPT_PRESETS)}")
        for name in ("seq_len", "num_train_tokens", "num_val_tokens"):
            value = getattr(self, name)
            if value is not None and value < 2:
                raise ValueError(f"{name} must be >= 2")
        if self.n_layer is not None and self.n_layer < 1:
            raise ValueError("n_layer must be >= 1")
        heads = GPT_PRESETS[self.preset].n_head
        if self.n_embd is not None and (self.n_embd < heads or self.n_embd % heads):
            raise ValueError(f"n_embd must be a multiple of the preset's n_head ({heads})")

    def resolved(self) -> Preset:
        p = GPT_PRESETS[self.preset]
        return Preset(self.n_layer or p.n_layer, p.n_head, self.n_embd or p.n_embd, self.seq_len or p.seq_len,
                      p.vocab_size,
                      self.num_train_tokens or p.num_train_tokens, self.num_val_tokens or p.num_val_tokens)


@dataclass(frozen=True)
class Registered:
    module: str  # imported only to build the workload, on a worker
    params: type
    unit: str


REGISTERED: dict[str, Registered] = {
    "image-cnn": Registered("trainables.workloads.image_cnn", ImageCnnParams, "samples"),
    "mlp-tabular": Registered("trainables.workloads.mlp_tabular", MlpTabularParams, "samples"),
    "gpt-lm": Registered("trainables.workloads.gpt_lm", GptLmParams, "tokens"),
}
