"""Every trial setting, declared once, as a field of one of two dataclasses.

Each declaration holds the setting's name, type, default, the rule a value must meet, help text and `torchrun`
flag. The two dataclasses are the loop's knobs a sweep may search (`LoopKnobs`) and the settings around them
(`TrialSettings`: the workload, the trial's length and clocks, telemetry, data, seed).
Everything else derives from them: the trial's config (`TrialConfig` is both), the spec's `space` vocabulary
and its checks, the spec fields that set a setting as it is (`sweeps.spec.settings`), the params each trial
logs, the flags of `python -m trainables.launch`, what decides memory (`Knob.memory`: the search's bounds and
the memory probe's combinations) and what a memory probe runs with (`Setting.probe`). Adding a setting
touches its declaration here, the code that uses it, and its test.

Torch-free: the service reads it without importing model code.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import MISSING, dataclass, field
from typing import Any, TypeVar

LR_SCHEDULES: tuple[str, ...] = ("constant", "cosine")
# Precision vocabulary (Lightning-style names). "32" is strict fp32 with TF32 off.
PRECISIONS: tuple[str, ...] = ("32", "tf32", "16-mixed", "bf16-mixed")
# How the ranks hold the model: DDP (each rank the whole model, gradients all-reduced), or FSDP2 `fully_shard`
# (parameters, gradients and optimizer state sharded over the ranks), resharding after forward or not, or hybrid:
# sharded over the ranks of each node, replicated across nodes (HSDP: FSDP2 on a nodes x ranks-per-node mesh)
STRATEGIES: tuple[str, ...] = ("ddp", "fsdp", "fsdp_no_reshard", "hsdp")
SHARDED: tuple[str, ...] = ("fsdp", "fsdp_no_reshard", "hsdp")
# Activation checkpointing on each repeated block: none, per-op selective (torchtitan's policy), full
AC_MODES: tuple[str, ...] = ("none", "selective", "full")

# The sweep's clock where its spec is silent (`sweeps.search.trials`): the measured window's least length on a
# GPU (a GPU step takes milliseconds: a window of a few steps is shorter than two telemetry samples; a CPU
# step takes tens of milliseconds or more, so num_steps already spans seconds), and, with a speed objective,
# the time boxes (max_window_s, max_warmup_s) on GPU and on CPU
GPU_MIN_WINDOW_S = 10.0
GPU_TIME_BOX_S = (30.0, 10.0)
CPU_TIME_BOX_S = (5.0, 3.0)


class _Same:
    """A declaration's "as the setting's default" (`Setting.sweep`, `Setting.torchrun`, `Setting.probe`)."""

    def __repr__(self) -> str:
        return "SAME"


SAME: Any = _Same()
REQUIRED: Any = MISSING  # a setting without a default: every trial's config names it


@dataclass(frozen=True)
class Setting:
    """What a trial setting is, beyond its name, type and default."""

    help: str
    minimum: float | None = None  # numbers: at least this (None: an int >= 1, a float > 0; -math.inf: any)
    choices: tuple[str, ...] | None = None  # text: one of these
    note: str = ""  # said after the rule, in the spec's error: "an integer >= 1 (per worker)"
    flag: bool | str = True  # a `trainables.launch` flag, named after it (text: its own name; False: the launcher
    # sets it itself, or a flag of its own does)
    sweep: Any = SAME  # the spec's default, where a sweep's differs from the loop's own (plain `torchrun`'s)
    torchrun: Any = SAME  # the launcher's default, where the trial's config has none (a required setting)
    probe: Any = SAME  # what a memory probe runs with: it asks whether a step fits, not how fast (`as_probe`)

    def rule(self, kind: type) -> str:
        """What values are allowed, in words."""
        if self.choices is not None:
            said = f"one of {list(self.choices)}"
        elif kind is bool:
            said = "true or false"
        elif kind is str:
            said = "text"
        elif kind is dict:
            said = "a mapping"
        elif self.minimum == -math.inf:
            said = "an integer" if kind is int else "a number"
        elif kind is int:
            said = f"an integer >= {int(self.minimum if self.minimum is not None else 1)}"
        else:
            said = f"a number >= {self.minimum:g}" if self.minimum is not None else "a number > 0"
        return f"{said} ({self.note})" if self.note else said

    def allows(self, kind: type, value: Any) -> bool:
        """Whether `value` is one this setting of type `kind` may take."""
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return False
            return value >= self.minimum if self.minimum is not None else value > 0
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return False
        if isinstance(value, int) and not isinstance(value, bool):
            return value >= (self.minimum if self.minimum is not None else 1)
        return self.choices is None or value in self.choices

    def bounds(self, kind: type) -> dict[str, float]:
        """The rule's bound on a number as pydantic says it (`ge`, `gt`): what a spec field checks."""
        if kind not in (int, float) or self.minimum == -math.inf:
            return {}
        if self.minimum is None:
            return {"ge": 1} if kind is int else {"gt": 0}
        return {"ge": self.minimum}

    def sweep_default(self, default: Any) -> Any:
        """What a spec that does not name it holds."""
        return default if self.sweep is SAME else self.sweep

    def torchrun_default(self, default: Any) -> Any:
        """What `trainables.launch` runs without its flag."""
        return default if self.torchrun is SAME else self.torchrun


@dataclass(frozen=True)
class Knob(Setting):
    """What a loop knob is, beyond a setting: how a sweep's `space` holds and searches it."""

    group: str = "loop"  # "loop" or "optim": the spec's error lists them apart
    implicit: bool = True  # a spec that does not name it holds it at its default in its space (and logs it)
    speed: bool = True  # it changes a step's speed (False: the optimizer's numbers only; twins are not told apart by it)
    memory: bool = False  # it decides, with the batch size, whether a trial fits in memory: a batch that ran out
    # bounds only trials with the same value (`sweeps.search.live_state.oom_key`), the memory probe measures each


def knob(default: Any, help: str, **meta: Any) -> Any:  # noqa: A002 - the field's help text
    return field(default=default, metadata={"setting": Knob(help, **meta)})


def setting(default: Any, help: str, **meta: Any) -> Any:  # noqa: A002 - the field's help text
    info = {"setting": Setting(help, **meta)}
    if default is REQUIRED:
        return field(metadata=info)
    if isinstance(default, dict):  # a fresh {} for every config
        return field(default_factory=dict, metadata=info)
    return field(default=default, metadata=info)


@dataclass(frozen=True, kw_only=True)
class LoopKnobs:
    """The knobs a sweep may search (`space.<name>`), each a field.

    A field holds the knob's default, and in `Knob` its rule, help and flag."""

    # the sweep sets it (a spec: space.num_workers, else scaling.num_workers); 0 in a config: whatever the
    # launcher started (torchrun)
    num_workers: int = knob(0, "ranks the trial runs on, one GPU each with use_gpu",
                            note="ranks per trial, one GPU each with use_gpu", implicit=False, flag=False,
                            memory=True)
    batch_size: int = knob(32, "samples per rank per micro-batch", note="per worker")
    precision: str = knob("32", "the loop's precision: autocast, and a GradScaler for 16-mixed", choices=PRECISIONS,
                          memory=True)
    lr: float = knob(1e-3, "the optimizer's learning rate (before lr_scaling)", speed=False)
    num_dataloader_workers: int = knob(0, "loader worker processes per rank", minimum=0)
    pin_memory: bool = knob(False, "pinned host memory for the batches (CUDA only)")
    prefetch_factor: int = knob(2, "batches per loader worker in flight", note="batches per loader worker in flight")
    persistent_workers: bool = knob(True, "keep loader workers alive across epochs")
    compile: bool = knob(False, "torch.compile the model (compile time falls in the untimed warm-up)", memory=True)
    tf32_under_autocast: bool = knob(False, "mixed precisions on CUDA: fp32 matmuls left by autocast use TF32",
                                     note="mixed precisions on CUDA: fp32 matmuls left by autocast use TF32",
                                     implicit=False)
    # not memory: a micro-batch's activations are the same whether its gradients accumulate (they are held either way)
    grad_accum_steps: int = knob(1, "micro-batches per optimizer step", note="micro-batches per optimizer step",
                                 group="optim", implicit=False)
    max_grad_norm: float = knob(0.0, "clip the global gradient norm to this after unscaling (0: off)",
                                note="0: no clipping", minimum=0, group="optim", implicit=False, speed=False)
    lr_warmup_steps: int = knob(0, "optimizer steps of linear LR warm-up", note="optimizer steps of linear LR warm-up",
                                minimum=0, group="optim", implicit=False, speed=False)
    accelerator_type: str = knob("", "the accelerator type the trial's ranks run on: a GPU type by the name Ray "
                                 "labels it with (H100, A100), or a CPU node type its nodes' label names; priced by "
                                 "the spec's cost section; empty: any", note="a GPU type or a node label; empty: any",
                                 implicit=False, flag=False, memory=True)
    strategy: str = knob("ddp", "how the ranks hold the model: ddp (each rank all of it), fsdp (FSDP2 fully_shard: "
                         "parameters, gradients and optimizer state sharded, each block resharded after its forward), "
                         "fsdp_no_reshard (kept gathered from forward to backward: less communication, more memory), "
                         "hsdp (sharded over each node's ranks, replicated across nodes: the all-gathers stay inside "
                         "a node; one node: as fsdp)",
                         choices=STRATEGIES, implicit=False, memory=True)
    activation_checkpointing: str = knob("none", "recompute each repeated block's activations in backward instead of "
                                         "keeping them: none, selective (per op, torchtitan's policy: matmul outputs "
                                         "every other one and attention kept), full", choices=AC_MODES,
                                         implicit=False, memory=True)
    cpu_offload: bool = knob(False, "sharded strategies only: keep parameters, gradients and optimizer state in host "
                             "memory and step the optimizer on the CPU (FSDP2's CPUOffloadPolicy): the last resort for "
                             "a model that fits no other way, several times slower; no effect without CUDA",
                             note="sharded strategies only", implicit=False, memory=True)
    lr_schedule: str = knob("constant", "after warm-up: constant, or cosine decay to 0 at the last step",
                            choices=LR_SCHEDULES, group="optim", implicit=False, speed=False)


@dataclass(frozen=True, kw_only=True)
class TrialSettings:
    """The settings around the loop's knobs, each a field.

    A field holds the setting's default (the loop's own, as plain `torchrun` runs it), and in `Setting` its
    rule, help, flag, a sweep's default where that differs, and what a memory probe runs with. A spec field that
    sets one as it is takes its default, rule and help from here (`sweeps.spec.settings`); the others the sweep
    works out (`sweeps.search.trials.resolve_trial`)."""

    workload: str = setting(REQUIRED, "a registered workload (`image-cnn`, `gpt-lm`, `mlp-tabular`) or "
                            "`package.module:function` returning a `trainables.Workload`", torchrun="image-cnn")
    num_steps: int = setting(REQUIRED, "measured steps, after warm-up", torchrun=50, probe=2)
    num_warmup_steps: int = setting(5, "untimed steps before the measured window: the build, loader start-up and "
                                    "compilation fall there", minimum=0, probe=1)
    telemetry_period_s: float = setting(1.0, "NVML/psutil sampling period; 0 turns sampling off", minimum=0, probe=0.0)
    workload_params: dict[str, Any] = setting({}, "the workload's own params (on the command line as JSON, e.g. "
                                              "'{\"width\": 32}')", flag="params")
    use_gpu: bool = setting(False, "train on GPUs over NCCL, one per rank (else CPUs over gloo)",
                            flag=False)  # the launcher: whether CUDA is there
    threads_per_worker: int = setting(1, "CPU cores each rank reserves (its torch threads)")
    report_interval_s: float = setting(10.0, "seconds between a trial's progress reports (a warm trial stops at its "
                                       "next one)", probe=1e9)
    seed: int = setting(0, "the sampler's seed, and every trial's model initialisation and data order",
                        minimum=-math.inf)
    data_dir: str = setting(".cache/datasets", "where workloads write their data files (relative: to each rank's "
                            "working directory, which is the sweep's)")
    metrics_path: str | None = setting(None, "rank 0 appends every report here as JSON lines (the launcher: "
                                       "instead of stdout)")
    loader_timeout_s: float = setting(120.0, "longest a step waits for one batch from a dataloader worker before the "
                                      "trial fails (0: forever)", minimum=0)
    collective_timeout_s: float = setting(600.0, "process-group timeout: a rank stuck in a collective (a hung peer) "
                                          "fails the trial after this")
    checkpoint_every_steps: int = setting(0, "measured steps between checkpoints (0: none); a trial whose worker or "
                                          "node died resumes from the last one", minimum=0, probe=0)
    probe: bool = setting(False, "a memory probe: every rank agrees each step whether any ran out of memory, no "
                          "gradient all-reduce, no FLOP count, no validation; the settings declared with a probe "
                          "value take it (`TrialConfig.as_probe`)", flag=False, probe=True)
    num_items: int = setting(0, "equal-data budget in the workload's unit, all ranks, warm-up included (replaces "
                             "num_steps; 0: off)", minimum=0, probe=0)
    grad_noise_scale: bool = setting(True, "measure stats/grad_noise_scale (DDP ranks, or micro-batches on one rank)",
                                     probe=False)
    eval_every_steps: int = setting(0, "evaluate every this many optimizer steps (warm-up included; 0: only at the "
                                    "end)", minimum=0, probe=0)
    # stop when an evaluation meets it: target_metric <= target_max / >= target_min (the launcher's --target)
    target_metric: str | None = setting(None, "the metric a target bounds", flag=False, probe=None)
    target_max: float | None = setting(None, "the target: at most this", minimum=-math.inf, flag=False, probe=None)
    target_min: float | None = setting(None, "the target: at least this", minimum=-math.inf, flag=False, probe=None)
    report_evals: bool = setting(False, "a report after each periodic evaluation (its values, time/elapsed_s): ASHA's "
                                 "curve", flag=False)
    min_window_s: float = setting(0.0, "the measured window lasts at least this long: more steps than num_steps if "
                                  f"needed (a sweep's budget.min_window_s: {GPU_MIN_WINDOW_S:g} on GPU where its spec "
                                  "is silent)", minimum=0, probe=0.0)
    max_window_s: float = setting(0.0, "the measured window ends once it lasts this long, before num_steps if need "
                                  "be (never fewer than 3 sub-windows; 0: off)", minimum=0, probe=0.0)
    max_warmup_s: float = setting(0.0, "warm-up ends once its timed steps (after step 0) last this long (never fewer "
                                  "than 2 steps; 0: off)", minimum=0, probe=0.0)
    usd_per_hour: float = setting(0.0, "what the trial's devices cost per hour: cost/usd_per_hour and "
                                  "cost/usd_per_1m_<unit> in every report (0: unpriced)", minimum=0)
    # a sweep traces by default (where each step's time went, for its verdicts); plain torchrun, the benchmark
    # baseline, only when asked
    trace_steps: int = setting(0, "profile the last this many warm-up steps of every trial on every rank (after one "
                               "profiler warm-up step): where each step's time went (trace/*), and each rank's trace "
                               "kept with the trial's run; 0 turns it off", minimum=0, sweep=2, probe=0)
    trace_dir: str | None = setting(None, "keep each rank's gzipped trace here (none: split, not kept)")


S = TypeVar("S", bound=Setting)


def _kind(annotation: Any) -> type:
    """A field's type as its rule reads it: `str | None` -> str, `dict[str, Any]` -> dict."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return _kind(args[0])
    return typing.get_origin(annotation) or annotation  # type: ignore[no-any-return]


def declared(cls: type, meta: type[S]) -> dict[str, tuple[type, Any, S]]:
    """The fields of `cls`: name -> (type, default (REQUIRED: none), what it is), in declaration order."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[type, Any, S]] = {}
    for f in dataclasses.fields(cls):
        what = f.metadata["setting"]
        assert isinstance(what, meta), f.name
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        out[f.name] = (_kind(hints[f.name]), default, what)
    return out


KNOBS = declared(LoopKnobs, Knob)
SETTINGS = declared(TrialSettings, Setting)
DECLARED: dict[str, tuple[type, Any, Setting]] = {**KNOBS, **SETTINGS}  # a trial's whole config
MEMORY_KNOBS = tuple(k for k, (_, _, d) in KNOBS.items() if d.memory)
PROBE_VALUES = {k: d.probe for k, (_, _, d) in DECLARED.items() if d.probe is not SAME}


def problem(name: str, value: Any) -> str:
    """Why `value` cannot be setting `name` ("" when it can): its declared rule (None where its default is)."""
    kind, default, what = DECLARED[name]
    if (value is None and default is None) or what.allows(kind, value):
        return ""
    return f"{name} must be {what.rule(kind)}, got {value!r}"


def sharding_problem(strategy: str, precision: str, cpu_offload: bool = False) -> str:
    """Say why `precision` (or `cpu_offload`) cannot train under `strategy`; "" when it can.

    Offloading to the CPU is FSDP2's (its `CPUOffloadPolicy` moves each rank's shard); DDP has no shard to move.

    fp16's GradScaler does not follow FSDP2's sharded gradients (each rank would check only its own shard for inf/NaN and ranks could disagree on skipping
    a step; torch's `ShardedGradScaler` is written for FSDP1's flat parameters and is not used here)."""
    if strategy in SHARDED and precision == "16-mixed":
        return (f"precision 16-mixed cannot train with strategy {strategy}: the GradScaler does not follow FSDP2's "
                "sharded gradients (ranks could disagree on skipping a step); use bf16-mixed (FSDP2's "
                "MixedPrecisionPolicy: bf16 parameters, fp32 gradient reduction), or strategy ddp")
    if cpu_offload and strategy not in SHARDED:
        return (f"cpu_offload needs a sharded strategy ({', '.join(SHARDED)}): FSDP2 offloads each rank's shard, "
                f"and strategy {strategy} has none; shard, or set cpu_offload false")
    return ""


def offload_problem(cpu_offload: bool, use_gpu: bool, max_grad_norm: float) -> str:
    """Say why `cpu_offload` cannot train here; "" when it can.

    On GPUs an offloaded shard's gradients are CPU tensors: clipping their norm all-reduces a CPU tensor, which the
    trial's NCCL-only process group cannot (torchtitan starts a gloo group beside it for this; this loop does not)."""
    if cpu_offload and use_gpu and max_grad_norm > 0:
        return (f"cpu_offload with max_grad_norm {max_grad_norm:g} on GPUs: the offloaded gradients' norm is a CPU "
                "tensor the NCCL process group cannot all-reduce; set max_grad_norm 0, or cpu_offload false")
    return ""
