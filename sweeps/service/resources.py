"""What a sweep asks of the cluster.

Each trial's resources, whether they fit, and the runtime environment of a local cluster."""

from __future__ import annotations

import glob
import os
from typing import Any

from ray import tune
from ray._common.constants import HEAD_NODE_RESOURCE_NAME

from sweeps.search.trials import largest_trial_need, max_loader_workers, worker_counts
from sweeps.spec import SpecError, SpecProblem, SweepSpec

# A trial's driver only launches and watches its Train workers: it holds no CPU, so a 2-core machine
# can run a 2-worker trial (Ray refuses an empty bundle; 1 byte of memory is not). It lives on the head
# node: left to Ray, a loaded cluster placed drivers on a worker node, and that node's loss ended their
# trials outright (the driver is what retries a trial whose workers died).
DRIVER_RESOURCES = tune.PlacementGroupFactory([{"CPU": 0, "memory": 1, HEAD_NODE_RESOURCE_NAME: 0.001}])


def concurrency_note(spec: SweepSpec, resources: dict[str, float], free: dict[str, float] | None = None) -> str:
    """Say how many trials fit the cluster at once (all workers of a trial start together).

    And, given what other work leaves `free` now (`sweeps.service.waits.free_for_sweep`), how many fit in that."""
    need = largest_trial_need(spec)
    fits = min(int(resources.get(k, 0) // v) for k, v in need.items() if v > 0)
    asked = spec.budget.max_concurrent_trials
    loaders = max_loader_workers(spec)
    also = f", with {loaders} loader worker(s) per rank" if loaders and spec.scaling.cpus_per_loader_worker else ""
    note = f"cluster fits {fits} trial(s) at once ({need['CPU']:g} CPU, {need['GPU']:g} GPU each at most{also})"
    now = fits
    if free is not None:
        now = min(int(free.get(k, 0) // v) for k, v in need.items() if v > 0)
        held = ", ".join(f"{free.get(k, 0):g} of {resources.get(k, 0):g} {k}" for k, v in need.items() if v > 0)
        note += f"; {now} fit in what is free now ({held} free)"
    note += f"; running {asked}"
    if fits == 0:
        return note + " — WARNING: not even one trial fits now; trials wait for the autoscaler or fail"
    if asked > fits:
        return note + f" — WARNING: only {fits} fit, the rest wait; set budget.max_concurrent_trials: {fits}"
    if now < asked:
        which = "its trials wait" if now == 0 else f"{asked - now} of its trials wait"
        return note + (f" — other work holds the rest: {which} until it is released (a warm group is held until its "
                       "sweep ends; budget.max_queue_s bounds the wait)")
    return note


def this_machine() -> dict[str, float]:
    """This machine's CPUs and NVIDIA GPUs as a local Ray cluster would count them (no torch, no Ray)."""
    gpus = len(glob.glob("/dev/nvidia[0-9]*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = min(gpus, len([d for d in visible.split(",") if d.strip()]))
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(gpus)}


def refuse_if_never_fits(spec: SweepSpec, resources: dict[str, float]) -> None:
    """Refuse a space whose largest trial never fits a fixed cluster (a local one).

    A trial that needs more than there is would wait forever: the largest the space allows (its most ranks and
    loader workers) must fit."""
    sc, need, loaders = spec.scaling, largest_trial_need(spec), max_loader_workers(spec)
    workers = max(worker_counts(spec))
    problems = []
    have_cpu, have_gpu = resources.get("CPU", 0), resources.get("GPU", 0)
    searched = spec.space.num_workers is not None
    # what to lower: the searched worker count names its own fix (the largest count that fits)
    fits = [n for n in worker_counts(spec) if sc.per_trial(loaders, n)["CPU"] <= have_cpu
            and sc.per_trial(loaders, n)["GPU"] <= have_gpu]
    fewer = (f"drop {workers} from space.num_workers (" + (f"at most {fits[-1]} fit" if fits else "no count fits")
             + ")") if searched else "lower them"
    if need["CPU"] > have_cpu and not (loaders and sc.cpus_per_loader_worker):
        problems.append(SpecProblem("space.num_workers" if searched else "scaling",
                                    f"{'the largest' if searched else 'a'} trial needs num_workers x cpus_per_worker = {workers} x "
                                    f"{sc.cpus_per_worker} CPUs but this cluster has {have_cpu:g}; {fewer} or "
                                    "run on a bigger cluster (ray job submit)"))
    elif need["CPU"] > have_cpu:
        problems.append(SpecProblem("scaling", f"the largest trial needs num_workers x (cpus_per_worker + "
                                    f"num_dataloader_workers x cpus_per_loader_worker) = {workers} x "
                                    f"({sc.cpus_per_worker} + {loaders} x {sc.cpus_per_loader_worker:g}) = "
                                    f"{need['CPU']:g} CPUs but this cluster has {have_cpu:g}; search fewer loader "
                                    + ("workers or ranks" if searched else "workers")
                                    + ", or on a small machine declare a smaller share "
                                    "(scaling.cpus_per_loader_worker: 0.5, or 0 to let loaders share their rank's cores)"))
    if need["GPU"] > have_gpu:
        problems.append(SpecProblem("space.num_workers" if searched else "scaling",
                                    f"{'the largest' if searched else 'a'} trial needs {need['GPU']:g} GPUs but this "
                                    f"cluster has {have_gpu:g} (one per rank); "
                                    + (f"{fewer}, " if searched else "") + "set use_gpu: false or run where GPUs are"))
    if problems:
        raise SpecError(f"sweep {spec.name}", problems)


def node_types(spec: SweepSpec, nodes: list[dict[str, Any]]) -> dict[str, int]:
    """Count the cluster's live nodes per accelerator type.

    A GPU node's type as Ray names it (its `accelerator_type:<T>` resource), a CPU node's by its
    `scaling.type_label` label."""
    found: dict[str, int] = {}
    for node in nodes:
        if not node.get("Alive", True):
            continue
        if spec.scaling.use_gpu:
            kinds = [k.split(":", 1)[1] for k in node.get("Resources", {}) if k.startswith("accelerator_type:")]
        else:
            kinds = [v for k, v in (node.get("Labels") or {}).items() if k == spec.scaling.type_label]
        for kind in kinds:
            found[kind] = found.get(kind, 0) + 1
    return found


def refuse_missing_types(spec: SweepSpec, nodes: list[dict[str, Any]]) -> None:
    """Refuse an accelerator type the trials may be pinned to that no node of the cluster carries.

    Every such type must be on some node of the cluster, or its trials would wait for it forever."""
    from sweeps.spec.cost import accelerator_types

    wanted = [k for k in accelerator_types(spec) if k]
    have = node_types(spec, nodes)
    missing = [k for k in wanted if k not in have]
    if not missing:
        return
    field = "space.accelerator_type" if spec.space.accelerator_type is not None else "scaling.accelerator_type"
    how = ("a GPU node of that type (Ray names it from the GPU: H100, A100, L4)" if spec.scaling.use_gpu else
           f"a node started with that label (`ray start --labels {spec.scaling.type_label}={missing[0]}`)")
    carried = ", ".join(f"{k} ({n} node{'s' if n != 1 else ''})" for k, n in sorted(have.items())) or "none"
    raise SpecError(f"sweep {spec.name}", [SpecProblem(field, f"no node of this cluster is of type "
                                                       f"{', '.join(missing)} (its types: {carried}); add {how}, or "
                                                       "drop the type from the spec")])


def this_node() -> dict[str, Any]:
    """Describe this machine as Ray would register it, for `sweeps validate --here`.

    Its GPU type (Ray's own name for it, where an NVIDIA GPU is visible) and no labels (a local `sweeps run`
    starts Ray without any)."""
    resources: dict[str, float] = {}
    if this_machine()["GPU"]:
        try:  # Ray's own name for the GPU: no public API gives it (pinned in tests/service/test_ray_private.py)
            from ray._private.accelerators import NvidiaGPUAcceleratorManager

            kind = NvidiaGPUAcceleratorManager.get_current_node_accelerator_type()
        except Exception:  # noqa: BLE001 - no NVML here: the type is not known, and none is claimed
            kind = None
        if kind:
            resources[f"accelerator_type:{kind}"] = 1.0
    return {"Alive": True, "Labels": {}, "Resources": resources}


# Ray Train V2 settings for every Train run a sweep starts, on a cluster too (inside `ray job submit`,
# where the job's runtime env is the user's): the controller polls its workers every 0.5 s instead of
# 2 s (a cold trial's reports are taken once per poll: its final report waited up to 2 s, and a queue of
# interim ones held the trial's node several seconds past its last step), and no preemption-watcher
# actor (one more process per run, which only logs node drains, and at its start an ERROR line about
# its constructor arguments, Ray issue 53727; a sweep retries a trial whose node went). `sweeps.service.trial`
# sets each where the process starting a run has none, and Ray hands them on to the run's controller.
TRAIN_RUN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
# On a local machine also no metrics callbacks (nothing scrapes them there). Together about 3 s of
# ~14 s per trial on 2 vCPU (benchmarks/sweep_overhead.py). A user's own values win.
LEAN_TRAIN_ENV = {**TRAIN_RUN_ENV, "RAY_TRAIN_METRICS_ENABLED": "0"}


def local_runtime_env(extra_env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Return the runtime env of a new local Ray instance.

    Outside a Ray job, let workers import user trainables from the current directory, as
    `ray job submit --working-dir .` does inside one, and start Ray Train lean; `extra_env` joins the
    variables every process of the new instance gets."""
    if os.environ.get("RAY_ADDRESS", "").strip() not in ("", "local") or os.environ.get("RAY_JOB_ID"):
        return None
    path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    lean = {k: os.environ.get(k, v) for k, v in LEAN_TRAIN_ENV.items()}
    return {"env_vars": {"PYTHONPATH": path, **lean, **(extra_env or {})}}
