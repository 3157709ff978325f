"""A trial's build, on each rank: the workload and its model, DDP (and compile) around it, and the rest.

The precision, the optimizer and the instruments, grouped as what trains (`ModelBundle`), what measures
(`Instruments`) and what the build cost (`BuildFacts`)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, default_collate

from trainables import contract, memory_model, registry
from trainables.batches import CountFn, checked_count, default_counter, loss_of, move_to_device, xy_step
from trainables.contract import TrialConfig
from trainables.flop_count import flops_per_item
from trainables.instruments import Instruments
from trainables.knobs import SHARDED
from trainables.loop_errors import WorkloadError
from trainables.memory_model import (
    Activations,
    ParamCounts,
    Prediction,
    measure_activations,
    model_states,
    optimizer_bytes_per_param,
)
from trainables.noise_scale import CommTimer, HookState, NoiseScale, ddp_hook
from trainables.peak_flops import cluster_peak
from trainables.precision import Precision, resolve_precision
from trainables.sharding import Blocks, Wrapping, find_blocks, offloads, shard
from trainables.telemetry import Telemetry
from trainables.window import world
from trainables.workloads.base import BuildContext, Workload, prepared

logger = logging.getLogger(__name__)


@dataclass
class ModelBundle:
    """What trains: the bare model, its DDP wrapper and the model the training forward calls.

    `model` is the bare module (clipping, state_dict, validation, FLOP counting), `ddp` the DDP wrapper
    (no_sync, the comm hook), `forward_model` what the training forward calls (the compiled DDP model when
    compiling)."""

    wl: Workload
    model: nn.Module
    ddp: DistributedDataParallel | None
    forward_model: nn.Module
    step_fn: Callable[[nn.Module, Any], Any]
    count: Callable[[Any], int]
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    channels_last: bool
    params: list[nn.Parameter]  # the trainable parameters (the noise scale's gradient norms)
    flops: tuple[float | None, str]  # training FLOPs per item, and "declared" or "counted"
    sharded: bool = False  # FSDP2 holds `model` (sharding.py): its forward and backward are collectives

    def gradient_sync(self, sync: bool) -> AbstractContextManager[object]:
        """Keep a DDP micro-batch's gradients local where `sync` is False: the last micro-batch reduces them all.

        A sharded model reduce-scatters every micro-batch, as torchtitan does: FSDP2 without gradient sync keeps
        each parameter's whole gradient (fp32 under bf16) on every rank until the last micro-batch, more than the
        model states the memory model counts, and a smaller micro-batch of a fixed global batch could then need
        more memory than a larger one."""
        if sync or self.ddp is None:
            return contextlib.nullcontext()
        return self.ddp.no_sync()


@dataclass
class BuildFacts:
    tags: dict[str, str]  # the precision's matmul flags, as the final report says them
    build_s: float = 0.0  # this rank's build: workload and its data, model to device, FLOPs, DDP, optimizer
    data_prep_s: float = 0.0  # of which making data files once per node (`ensure_cached`): no later trial repeats it
    data_cached: int = 0  # `ensure_cached` calls in the build: 0 where the workload keeps its data some other way
    predicted: Prediction | None = None  # this rank's peak memory, predicted before its first step
    recomputed_flops: float | None = None  # per item, what activation checkpointing runs again (None: not measured)


@dataclass
class Built:
    """One rank's trial, built: its config and place, what trains, what measures, what the build cost."""

    cfg: TrialConfig
    device: torch.device
    rank: int
    world: int
    prec: Precision
    pin: bool
    m: ModelBundle
    inst: Instruments
    facts: BuildFacts


def build(cfg: TrialConfig, device: torch.device) -> Built:
    """Build everything a trial trains with, on this rank.

    Its workload, model, DDP, compile, precision, optimizer and instruments (every rank calls it; rank 0 counts
    the FLOPs)."""
    t0, (prep0, calls0) = time.perf_counter(), prepared()
    rank, world_size = world()
    if cfg.num_workers and cfg.num_workers != world_size:  # the service routes each trial to a group of its size
        raise RuntimeError(f"this trial is for {cfg.num_workers} rank(s) but runs on {world_size}")
    torch.set_num_threads(cfg.threads_per_worker)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(cfg.seed)
    prec = resolve_precision(cfg.precision, device, cfg.tf32_under_autocast)  # before any work: unsupported fails fast
    prec_bytes_16 = prec.autocast_dtype is not None  # the forward's parameters: autocast's or FSDP2's 16-bit copies
    tags = prec.apply_matmul_flags()
    if cfg.tf32_under_autocast and device.type != "cuda" and rank == 0:
        warnings.warn("tf32_under_autocast has no effect without CUDA (a CPU has no TF32)", stacklevel=3)
    wl = registry.build(cfg.workload, cfg.workload_params, BuildContext(cfg.data_dir, cfg.seed, rank, world_size))
    model = wl.model.to(device)
    channels_last = device.type == "cuda" and wl.channels_last
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    step_fn = wl.step_fn or xy_step(wl.loss_fn)  # type: ignore[arg-type]  # check() ensured one of them
    count = wl.count_items or default_counter(wl.items_per_sample)
    flops: tuple[float | None, str] = (wl.flops_per_item, "declared")
    if flops[0] is None and rank == 0 and not cfg.probe:  # rank 0 reports; before DDP sees a backward
        flops = (count_flops(wl, model, cfg, device, step_fn, count), "counted")
    # torchtitan's order: activation checkpointing on each block, compile each block, fully_shard each block and
    # the root (sharding.py); DDP wraps the model as before
    blocks = find_blocks(model, wl.blocks)
    activations = None if cfg.probe else sample_activations(wl, model, blocks, step_fn, prec, count)
    counts = ParamCounts.of(model, blocks)
    layout = shard(model, blocks, Wrapping.of(cfg.strategy, cfg.activation_checkpointing, cfg.compile, cfg.precision,
                                                cfg.cpu_offload),
                   device, world_size)
    tags |= layout.tags
    if layout.sharded and prec.autocast_dtype is not None:  # FSDP2's MixedPrecisionPolicy casts: no autocast
        prec = dataclasses.replace(prec, autocast_dtype=None)
        tags["precision/autocast_dtype"] = "none (FSDP2 MixedPrecisionPolicy)"
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if world_size > 1 and not layout.sharded else None
    # Compile the DDP-wrapped model (PyTorch's guidance): DDP's optimizer splits the graph at its
    # buckets, so the gradient all-reduce still overlaps backward. Sharded: each block was compiled (a
    # model without blocks is compiled whole)
    forward_model: nn.Module = ddp if ddp is not None else model
    if cfg.compile and not (layout.sharded and blocks.container is not None):
        forward_model = torch.compile(forward_model)  # type: ignore[assignment]
    # Gradient noise scale: DDP ranks read it in the all-reduce hook; one rank from its micro-batches.
    # The same hook times the all-reduce wait backward did not hide (DDP takes one hook).
    noise: NoiseScale | None = None
    if cfg.grad_noise_scale and (ddp is not None or cfg.grad_accum_steps > 1) and not layout.sharded:
        noise = NoiseScale(device)
    comm = CommTimer(device) if ddp is not None and not cfg.probe else None
    if ddp is not None and (noise is not None or comm is not None):
        ddp.register_comm_hook(HookState(world_size, noise, comm), ddp_hook)
    pin = cfg.pin_memory and device.type == "cuda"
    if cfg.pin_memory and not pin and rank == 0:
        warnings.warn("pin_memory=True has no effect without CUDA; running unpinned", stacklevel=3)
    telemetry = Telemetry(device, cfg.telemetry_period_s) if cfg.telemetry_period_s > 0 else None
    optimizer = make_optimizer(wl, model, cfg, device)
    prep_s, calls = prepared()
    bundle = ModelBundle(wl, model, ddp, forward_model, step_fn, count, optimizer, prec.make_scaler(), channels_last,
                         [p for p in model.parameters() if p.requires_grad], flops, layout.sharded)
    predicted = predict(counts, activations, optimizer, cfg, layout.shard_over, 2 if prec_bytes_16 else 4)
    facts = BuildFacts(tags, build_s=time.perf_counter() - t0, data_prep_s=prep_s - prep0, data_cached=calls - calls0,
                       predicted=predicted, recomputed_flops=activations.recomputed_flops(cfg.activation_checkpointing)
                       if activations is not None else None)
    return Built(cfg, device, rank, world_size, prec, pin, bundle, Instruments(telemetry, noise, comm), facts)


def sample_activations(wl: Workload, model: nn.Module, blocks: Blocks, step: Callable[[nn.Module, Any], Any],
                       prec: Precision, count: CountFn) -> Activations | None:
    """Measure what the forward keeps for backward, per activation-checkpointing mode, per sample and per forward.

    From the forwards of the first validation sample and of it twice (`Activations.fit`).
    None where it cannot (a warning says why). The bare model, before sharding; its buffers and the RNG streams
    are left as they were."""
    first = next(iter(DataLoader(wl.val_dataset, batch_size=None, collate_fn=lambda s: s)), None)
    if first is None:
        return None
    collate = wl.collate_fn or default_collate
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        batches = [collate([first]), collate([first, first])]  # the same sample twice: exactly twice the items
        items = [checked_count(count, b) for b in batches]
        measured = []
        for n, batch in enumerate(batches if items[1] == 2 * items[0] else batches[:1], start=1):
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                on_device = move_to_device(batch, device)
                forward = partial(_loss_of_step, step, on_device)
                memory_model.measuring_pass = n
                measured.append(measure_activations(model, blocks, forward, prec.autocast()))
        if len(measured) == 1:  # a count that does not double: one forward, all of it as if per sample
            logger.warning("activation memory from one sample only (%d items, %d for the same sample twice): "
                           "what a forward saves once counts per sample", items[0], items[1])
            return dataclasses.replace(measured[0], items=items[0], first_grad=0)
        return dataclasses.replace(Activations.fit(*measured), items=items[0])
    except Exception as exc:  # noqa: BLE001 - a forward the measurement cannot run only loses the prediction
        logger.warning("activation memory not measured (%s: %s): memory/predicted_gib will be absent",
                       type(exc).__name__, exc)
        return None
    finally:
        memory_model.measuring_pass = 0
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])


def _loss_of_step(step: Callable[[nn.Module, Any], Any], batch: Any, model: nn.Module) -> torch.Tensor:
    return loss_of(step(model, batch), training=True)


def predict(counts: ParamCounts, activations: Activations | None, optimizer: torch.optim.Optimizer,
            cfg: TrialConfig, over: int, compute_bytes: int) -> Prediction | None:
    """This rank's predicted peak: model states by strategy, the micro-batch's activations by AC mode.

    `over`: the ranks each parameter is sharded over (`Layout.shard_over`: one node's under hsdp)."""
    optimizer_bytes = optimizer_bytes_per_param(optimizer)
    if activations is None or optimizer_bytes is None:
        return None
    states = model_states(counts, over, cfg.strategy, compute_bytes, optimizer_bytes, cfg.cpu_offload and cfg.use_gpu)
    # sharded: FSDP2's MixedPrecisionPolicy gathers 16-bit parameters (in `states`); autocast copies nothing
    acts = activations.of(cfg.activation_checkpointing, cfg.batch_size, fixed=cfg.strategy not in SHARDED)
    return Prediction(states, acts)


def gpu_layout(device: torch.device, precision: str, world: int) -> tuple[float | None, dict[str, str]]:
    """Every rank's GPU model and UUID (all ranks call this): the trial's summed peak FLOP/s and tags."""
    if device.type != "cuda":
        return None, {}
    mine = (torch.cuda.get_device_name(device), str(getattr(torch.cuda.get_device_properties(device), "uuid", device)))
    devices: list[Any] = [mine]
    if world > 1:
        devices = [None] * world
        torch.distributed.all_gather_object(devices, mine)
    return cluster_peak([tuple(d) for d in devices], precision)


def count_flops(wl: Workload, model: nn.Module, cfg: TrialConfig, device: torch.device,
                 step: Callable[[nn.Module, Any], Any], count: Callable[[Any], int]) -> float | None:
    """Count the training FLOPs per item of a workload that does not declare them.

    Counted once by `torch.utils.flop_counter` on one validation batch, on the bare model before DDP wraps it."""
    loader = DataLoader(wl.val_dataset, batch_size=cfg.batch_size, collate_fn=wl.collate_fn)
    batch = next(iter(loader), None)
    if batch is None:
        return None
    return flops_per_item(model, step, move_to_device(batch, device), count)


def flops_metrics(final: dict[str, Any], wl: Workload, peak: float | None, per_item: float | None,
                  recomputed: float | None = None) -> dict[str, float]:
    """Return achieved TFLOP/s where the FLOPs per item are known (declared or counted).

    MFU too, where every rank's peak is known: the model's FLOPs only. Where the recomputation per item is
    known (`BuildFacts.recomputed_flops`), the hardware's beside them: the model's plus what activation
    checkpointing ran again (HFU; equal to MFU without checkpointing)."""
    if per_item is None:
        return {}
    items_per_s = final[contract.throughput_key(wl.unit)]
    out = {contract.TFLOPS: items_per_s * per_item / 1e12}
    if recomputed is not None:
        out[contract.HW_TFLOPS] = items_per_s * (per_item + recomputed) / 1e12
    if peak is not None:
        out[contract.MFU_PCT] = 100.0 * items_per_s * per_item / peak
        if recomputed is not None:
            out[contract.HFU_PCT] = 100.0 * items_per_s * (per_item + recomputed) / peak
    return out


def make_optimizer(wl: Workload, model: nn.Module, cfg: TrialConfig, device: torch.device) -> torch.optim.Optimizer:
    if wl.optimizer_fn is None:
        # fused AdamW runs on the device; an offloaded shard steps on the CPU
        return torch.optim.AdamW(model.parameters(), lr=cfg.lr, fused=device.type == "cuda" and not offloads(cfg.cpu_offload, device))
    optimizer = wl.optimizer_fn(model, cfg.lr)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise WorkloadError(f"optimizer_fn returned {type(optimizer).__name__}, not a torch.optim.Optimizer: build "
                            "one over model's parameters with the lr it is given")
    if offloads(cfg.cpu_offload, device) and any(g.get("fused") for g in optimizer.param_groups):
        # before the first step, which would fail on the offloaded shards with a CUDA kernel's error
        raise WorkloadError(f"optimizer_fn built a fused {type(optimizer).__name__}, which steps on the GPU, and "
                            "cpu_offload true keeps the shards and optimizer state in host memory: build it "
                            "with fused=False, or set cpu_offload false")
    return optimizer


def compile_cache_counts() -> tuple[int, int, int]:
    """Return this process's compile counts so far: (dynamo's graphs, cache hits, inductor's compiled graphs).

    They are `torch.compile`'s counters, which grow over the trials a warm rank runs (a trial takes the
    difference); compiled is the cache's misses and bypasses."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return (counters["stats"]["unique_graphs"], inductor["fxgraph_cache_hit"],
            inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_bypass"])
