"""Linear regression with Gaussian noise: a problem whose gradient noise scale is known exactly.

y = x . w* + eps, x ~ N(0, I_d), eps ~ N(0, sigma^2), loss = mean squared error. At weights
w = w* + delta the per-sample gradient is 2 x (x . delta - eps), so (Gaussian fourth moments)

    G = 2 delta,  tr(Sigma) = 4 ((d + 1) |delta|^2 + d sigma^2),  B_noise = tr(Sigma) / |G|^2
      = ((d + 1) |delta|^2 + d sigma^2) / |delta|^2.

Plain SGD with a vanishing learning rate keeps w where it starts, so the answer stays constant over
the run. Fresh samples are drawn for every batch (an endless stream per rank): no finite-dataset bias.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.utils.data import IterableDataset, get_worker_info

from trainables import BuildContext, Workload

PARAMS = {"dim": 16, "sigma": 1.0, "delta_norm": 2.0, "num_val": 256}


def analytic_noise_scale(dim: int, sigma: float, delta_norm: float) -> float:
    return ((dim + 1) * delta_norm**2 + dim * sigma**2) / delta_norm**2


class _Stream(IterableDataset[Any]):
    def __init__(self, w_star: torch.Tensor, sigma: float, seed: int) -> None:
        self.w_star, self.sigma, self.seed = w_star, sigma, seed

    def __iter__(self) -> Any:
        info = get_worker_info()
        g = torch.Generator().manual_seed(self.seed * 1000 + (info.id if info else 0))
        while True:
            x = torch.randn(self.w_star.numel(), generator=g)
            yield x, (x @ self.w_star + self.sigma * torch.randn((), generator=g)).reshape(1)


def build(params: dict[str, Any], ctx: BuildContext) -> Workload:
    p = {**PARAMS, **params}
    dim, sigma, norm = int(p["dim"]), float(p["sigma"]), float(p["delta_norm"])
    g = torch.Generator().manual_seed(ctx.seed)
    w_star = torch.randn(dim, generator=g)
    model = nn.Linear(dim, 1, bias=False)
    direction = torch.randn(dim, generator=g)
    with torch.no_grad():
        model.weight.copy_((w_star + norm * direction / direction.norm()).reshape(1, dim))
    val_x = torch.randn(int(p["num_val"]), dim, generator=g)
    val = torch.utils.data.TensorDataset(val_x, (val_x @ w_star + sigma * torch.randn(len(val_x), generator=g))[:, None])
    return Workload(
        model=model, train_dataset=_Stream(w_star, sigma, ctx.seed + 7919 * (ctx.rank + 1)), val_dataset=val,
        loss_fn=nn.functional.mse_loss,
        optimizer_fn=lambda m, lr: torch.optim.SGD(m.parameters(), lr=lr),
    )


assert math.isclose(analytic_noise_scale(16, 1.0, 2.0), 21.0)
