"""The spec's other sections, one small model each, every field with its doc.

They are the trainable, the search, the budget, lr scaling, the quality guardrail, scaling, telemetry and
tracking."""

from __future__ import annotations

import math
import os
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from sweeps.spec.params import STRICT
from sweeps.spec.settings import setting_field
from sweeps.store import DEFAULT_URI, database_uri_problem, file_store_problem
from trainables import registry
from trainables.contract import items_problem, window_problem
from trainables.knobs import CPU_TIME_BOX_S, GPU_MIN_WINDOW_S, GPU_TIME_BOX_S


class TrainableSpec(BaseModel):
    model_config = STRICT
    name: str = setting_field("workload")
    params: dict[str, Any] = Field(default_factory=dict, description="the trainable's own params, the same for every "
                                   "trial (search one as `space.params.<name>` instead)")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        registry.check_name(name)
        return name

    @field_validator("params")
    @classmethod
    def _params(cls, params: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("name")
        problems = registry.check_params(name, params) if name else []
        if problems:
            raise ValueError("; ".join(problems))
        return params


class EarlyStoppingSpec(BaseModel):
    """ASHA: at rungs grace * reduction_factor**k, keep the best 1/reduction_factor of trials.

    The grace is in measured steps, or, for a time-to-target objective, in seconds of training."""

    model_config = STRICT
    grace_steps: int | None = Field(default=None, ge=1, description="measured steps every trial runs before it "
                                    "may be stopped (trials compared at equal steps)")
    grace_s: float | None = Field(default=None, gt=0, description="with objective.target: seconds of training "
                                  "(evaluations counted) before a trial may be stopped; trials are compared on the "
                                  "target metric at equal training time")
    reduction_factor: int = Field(default=3, ge=2, description="at each rung ASHA keeps the best 1/reduction_factor of "
                                  "the trials")

    @model_validator(mode="after")
    def _one_grace(self) -> EarlyStoppingSpec:
        if (self.grace_steps is None) == (self.grace_s is None):
            raise ValueError("give exactly one of grace_steps (measured steps) or grace_s (seconds of training, "
                             "for a time-to-target objective)")
        return self


class SearchSpec(BaseModel):
    model_config = STRICT
    algorithm: Literal["tpe", "random", "grid"] = Field(
        default="tpe", description="tpe: Optuna TPE (constraint-aware); random; grid: every combination once")
    early_stopping: EarlyStoppingSpec | None = Field(default=None, description="ASHA: at rungs grace x "
                                                     "reduction_factor^k, stop all but the best trials (none: every "
                                                     "trial runs its whole budget)")
    probe_batch_size: bool = Field(default=False, description="before the search, find the largest batch size "
                                   "that fits for every combination of precision, compile and categorical params "
                                   "(a few steps per candidate, binary search on the warm workers); a batch the "
                                   "probe saw fail is never run unless the probe measured that combination")
    when_exhausted: Literal["stop", "replicate"] = Field(
        default="stop", description="a configuration is never run twice; when every configuration of a finite "
        "space has run before num_trials: stop (and say so), or replicate: spend the rest on replicates of the "
        "best configuration and those within noise of it (a close call settled by more measurements)")
    trials_per_size: int | None = Field(
        default=None, ge=1, description="with num_workers searched by tpe or random: trials run back to back on one "
        "worker count before the search may change it (each change restarts a warm worker group); default "
        "num_trials / (worker counts + 1): one run per count, then runs of the count the sampler picks")




# The param a trial of a sweep with budget.global_batch_size logs (true): its grad_accum_steps followed from its
# batch_size and num_workers, so comparisons hold it as following from them (`sweeps.results.outcome.twins`)
GLOBAL_BATCH_FIXED = "global_batch_fixed"


class BudgetSpec(BaseModel):
    model_config = STRICT
    num_trials: int = Field(ge=1, le=10_000, description="trials to run (grid search: the grid's size)")
    max_concurrent_trials: int = Field(default=1, ge=1, description="trials that run at once (each holds its ranks; "
                                       "with warm groups, one group per trial at once)")
    num_steps: int | None = Field(default=None, ge=1, description="measured steps per trial, after warm-up (equal "
                                  "steps: right for throughput alone)")
    num_samples: int | None = Field(default=None, ge=1, description="equal data: every trial trains on this many "
                                    "samples (all workers, warm-up included) whatever its global batch size")
    num_tokens: int | None = Field(default=None, ge=1, description="equal data for a token-counting trainable")
    eval_every_steps: int | None = Field(default=None, ge=1, description="evaluate on the validation set every this "
                                         "many optimizer steps (needed by objective.target)")
    global_batch_size: int | None = Field(default=None, ge=1, description="a fixed global batch: every trial steps "
                                          "its optimizer on this many samples (all ranks), its accumulation worked "
                                          "out as global_batch_size / (batch_size x num_workers) (logged as "
                                          "grad_accum_steps); each batch size and worker count the space allows "
                                          "must divide it, and the space may not name grad_accum_steps. The way to "
                                          "compare memory knobs fairly: a micro-batch that fits only with sharding "
                                          "or checkpointing trains the same model")
    num_warmup_steps: int = setting_field("num_warmup_steps")
    min_window_s: float | None = Field(default=None, ge=0, description="with num_steps: each trial's measured window "
                                       "lasts at least this long, running more steps than num_steps if needed (the "
                                       "number run is logged as progress/steps); default "
                                       f"{GPU_MIN_WINDOW_S:g} on GPU, 0 on CPU")
    max_window_s: float | None = Field(default=None, gt=0, description="with num_steps: each trial's measured window "
                                       "ends once it lasts this long, with fewer steps than num_steps if need be (never "
                                       "fewer than the 3 sub-windows the throughput's noise figure needs); default "
                                       f"{GPU_TIME_BOX_S[0]:g} on GPU, {CPU_TIME_BOX_S[0]:g} on CPU; off by default "
                                       "with objective.constraints (a quality constraint wants equal steps)")
    max_warmup_s: float | None = Field(default=None, gt=0, description="with num_steps: warm-up ends once its timed "
                                       "steps (after step 0, which builds, starts loaders and compiles) last this long, "
                                       "with fewer steps than num_warmup_steps if need be (never fewer than 2); "
                                       f"default {GPU_TIME_BOX_S[1]:g} on GPU, {CPU_TIME_BOX_S[1]:g} on CPU")
    report_interval_s: float = setting_field("report_interval_s")
    max_retries: int = Field(default=1, ge=0, description="re-runs of a trial whose worker or node died "
                             "(transient); other failures are final")
    max_identical_failures: int = Field(default=3, ge=0, description="stop the sweep after this many trials "
                                        "in a row fail with the same error (0: never)")
    loader_timeout_s: float = setting_field("loader_timeout_s")
    collective_timeout_s: float = setting_field("collective_timeout_s")
    checkpoint_every_steps: int = setting_field("checkpoint_every_steps")
    time_budget_s: float | None = Field(default=None, gt=0, description="wall-clock limit for the whole sweep: "
                                        "no trial starts after it, running ones are stopped")
    max_queue_s: float | None = Field(default=None, gt=0, description="longest the sweep waits at once for resources "
                                      "that other work holds (a worker group whose CPUs or GPUs other jobs hold, "
                                      "or an autoscaler has yet to add); past it the sweep stops, resumable (exit "
                                      "4), and says what it waited for. Default: it waits as long as it takes")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Leave out a field added after sweeps were saved where it is unset, so their spec digest still matches."""
        out = handler(self)
        later = ("global_batch_size",)
        return {k: v for k, v in out.items() if not (k in later and v is None)} if isinstance(out, dict) else out

    @model_validator(mode="after")
    def _one_length(self) -> BudgetSpec:
        given = [k for k in ("num_steps", "num_samples", "num_tokens") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one trial length: num_steps (equal steps, for throughput), or num_samples "
                             "/ num_tokens (equal data: loss and time to target comparable across batch sizes)"
                             + (f"; got {' and '.join(given)}" if given else ""))
        if self.num_steps is None and self.min_window_s:
            raise ValueError(f"min_window_s: {self.min_window_s:g} has no effect with {given[0]}: an equal-data budget "
                             "sets each trial's length (its data, not the clock); remove min_window_s, or use num_steps")
        boxed = [k for k in ("max_window_s", "max_warmup_s") if getattr(self, k) is not None]
        if self.num_steps is None and boxed:
            raise ValueError(f"{boxed[0]}: {getattr(self, boxed[0]):g} has no effect with {given[0]}: an equal-data "
                             f"budget sets each trial's length (its data, not the clock); remove {boxed[0]}, or use "
                             "num_steps")
        if self.max_window_s is not None and self.num_warmup_steps < 2:
            raise ValueError(f"max_window_s: {self.max_window_s:g} plans each window's steps from a timed warm-up "
                             f"step, and num_warmup_steps: {self.num_warmup_steps} times none; set num_warmup_steps "
                             ">= 2, or remove max_window_s")
        problem = window_problem(self.min_window_s or 0.0, self.max_window_s or 0.0, self.max_warmup_s or 0.0) or \
            items_problem(given[0], self.num_items, self.num_warmup_steps)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def num_items(self) -> int:
        """The equal-data budget (0 with num_steps)."""
        return self.num_samples or self.num_tokens or 0

    @property
    def item_unit(self) -> str | None:
        return "samples" if self.num_samples else "tokens" if self.num_tokens else None


class LrScalingSpec(BaseModel):
    """Scale the searched lr to each trial's global batch.

    The searched lr is the rate at `reference_batch_size` (global); each trial runs it scaled to its own
    global batch: linear (Goyal et al. 2017, SGD) or sqrt (Adam-family)."""

    model_config = STRICT
    rule: Literal["linear", "sqrt", "none"] = Field(description="linear (SGD: Goyal et al. 2017), sqrt (Adam-family) "
                                                    "or none")
    reference_batch_size: int = Field(ge=1, description="the global batch size (batch x accumulation x workers) "
                                      "the searched lr is meant for")

    def factor(self, global_batch: int) -> float:
        ratio = global_batch / self.reference_batch_size
        return ratio if self.rule == "linear" else math.sqrt(ratio) if self.rule == "sqrt" else 1.0


class QualitySpec(BaseModel):
    """The convergence guardrail: a trial that converges worse than the fp32 reference is never ranked best.

    At equal data, a trial whose loss/val is worse than the sweep's fp32 reference by more than `tolerance`
    (relative) is degraded: shown, never ranked best."""

    model_config = STRICT
    tolerance: float = Field(default=0.05, ge=0, description="relative gap to the fp32 reference's loss/val "
                             "(0.05: 5% worse) past which a trial is degraded")


class ScalingSpec(BaseModel):
    model_config = STRICT
    num_workers: int = Field(default=2, ge=1, description="ranks per trial (one GPU each with use_gpu); search it as "
                             "space.num_workers instead")
    use_gpu: bool = setting_field("use_gpu")
    cpus_per_worker: int = setting_field("threads_per_worker")
    gpus_per_worker: float = Field(default=0.0, ge=0, description="GPUs per rank: 1 with use_gpu (set for you)")
    accelerator_type: str | None = Field(default=None, description="pin every rank of every trial to one type: a GPU "
                                         "type by the name Ray labels it with (e.g. H100, A100), or on CPU a node "
                                         "type named by the nodes' type_label; search it as space.accelerator_type")
    type_label: str = Field(default="accelerator-type", min_length=1, description="on CPU: the node label whose "
                            "value names a node's type (`ray start --labels accelerator-type=c7i`); GPU nodes carry "
                            "Ray's own accelerator type")
    cpus_per_loader_worker: float = Field(default=1.0, ge=0, description="CPUs reserved for each dataloader "
                                          "worker process of a rank, on top of cpus_per_worker")
    reuse_workers: bool = Field(default=True, description="warm worker groups: one long-lived Ray Train group per "
                                "concurrency slot serves trial after trial (start-up paid once per slot); false: "
                                "a new Ray Train run for every trial")

    def cpus_per_rank(self, loader_workers: int) -> float:
        """What one Train worker reserves: its own cores and its loader worker processes' share."""
        return self.cpus_per_worker + loader_workers * self.cpus_per_loader_worker

    def per_trial(self, loader_workers: int = 0, num_workers: int | None = None) -> dict[str, float]:
        """What one trial of `num_workers` ranks (default: this section's) holds at once.

        All its workers start together, so this is the whole trial's reservation."""
        n = self.num_workers if num_workers is None else num_workers
        return {"CPU": n * self.cpus_per_rank(loader_workers), "GPU": n * self.gpus_per_worker}

    @model_validator(mode="after")
    def _gpus(self) -> ScalingSpec:
        if self.use_gpu and self.gpus_per_worker == 0:
            object.__setattr__(self, "gpus_per_worker", 1.0)
        if not self.use_gpu and self.gpus_per_worker > 0:
            raise ValueError("gpus_per_worker > 0 needs use_gpu: true")
        if self.use_gpu and self.gpus_per_worker != 1:
            why = ("two or more ranks would share one GPU: NCCL refuses two ranks on one device, and their "
                   "utilisation, memory and MFU could not be told apart" if self.gpus_per_worker < 1 else
                   "the DDP loop drives one GPU per rank; the others would sit idle while counted in MFU")
            raise ValueError(f"gpus_per_worker must be 1 with use_gpu ({why}); for more GPUs per trial raise "
                             "num_workers (one rank per GPU)")
        return self


# a spec key that was renamed -> the field that replaced it: a spec that still names it is refused with the fix
RENAMED = {"telemetry.trace": "telemetry.trace_steps"}  # one name in the spec, the trial's config and the launcher


class TelemetrySpec(BaseModel):
    model_config = STRICT
    period_s: float = setting_field("telemetry_period_s")
    trace_steps: int = setting_field("trace_steps")


class TrackingSpec(BaseModel):
    model_config = STRICT
    uri: str | None = Field(default=None, description="MLflow URI: a tracking server (http(s)://, its login from "
                            "MLFLOW_TRACKING_USERNAME/PASSWORD or _TOKEN) or a sqlite:/// file; a database such as "
                            "postgresql:// only behind a server; default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    experiment: str | None = Field(default=None, description="default: the sweep name")

    @field_validator("uri")
    @classmethod
    def _supported(cls, uri: str | None) -> str | None:
        problem = (file_store_problem(uri) or database_uri_problem(uri)) if uri is not None else None
        if problem:
            raise ValueError(problem)
        return uri

    def resolved_uri(self) -> str:
        return self.uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
