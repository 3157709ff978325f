"""Run `sweeps doctor`: report what this machine, or each node of a Ray cluster, can do.

With `--gpu-checks` it also checks whether every GPU path the service depends on works there.

Locally it measures in this process (no Ray). With `--address` it runs one Ray task per alive node,
pinned to it; the matmul peaks are measured on the first node of each GPU type. Every failure is a
finding in the report (a node that dies, NVML missing, a small /dev/shm), never a traceback. The
torch side lives in `trainables.doctor_checks`, imported only when measuring.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sweeps.results.sol import (
    DOCTOR_EXPERIMENT,
    DOCTOR_TAG,
    HARDWARE_TAG,
    KERNEL_ENV_FACT,
    annotate_node,
    hardware_key,
    score,
)
from trainables.contract import (
    ENERGY_TOTAL_J,
    GPU_POWER_MEAN_W,
    GPU_SM_ACTIVE_PCT,
    GPU_TENSOR_ACTIVE_PCT,
    GPU_UTIL_MEAN_PCT,
    LOSS_TRAIN,
    MFU_PCT,
    SOL_PCT,
    STEP_TIME_MS,
    TFLOPS,
    WORLD_SIZE,
    throughput_key,
)
from trainables.storage import is_uri

logger = logging.getLogger(__name__)
NODE_TIMEOUT_S = {True: 120.0, False: 600.0}  # per node, quick or full
GPU_CHECKS_TIMEOUT_S = 1500.0  # on top, with --gpu-checks: five loop runs of at most 300 s each


@dataclass(frozen=True)
class Check:
    """One GPU-path check: `pass`, `fail` or `skip`, with the evidence (what ran and what it showed)."""

    name: str
    status: str
    evidence: str


# --- one node -------------------------------------------------------------------------------


def node_task(quick: bool, gpu_checks: bool, storage_path: str, measure_peak: bool = True) -> dict[str, Any]:
    """Everything the doctor does on one node (a Ray task body, so module level); JSON-able."""
    from trainables import doctor_checks

    node = doctor_checks.measure_node(quick, storage_path, measure_peak)
    node["hardware_key"] = hardware_key(node["facts"]["device/type"], node["facts"]["device/name"])
    annotate_node(node["figures"], node["facts"])  # emulated or not; the kernel variables it measured under
    if gpu_checks:
        node["checks"] = [asdict(c) for c in run_checks(node["facts"], node["figures"], quick)]
    doctor_checks.release_device_memory()
    return node


# --- GPU-path checks: the shared loop under torchrun-like local processes ------------------------------


@dataclass(frozen=True)
class LoopRun:
    args: tuple[str, ...]
    nproc: int


_TINY_LM = ("--workload", "gpt-lm", "--params", '{"preset": "tiny"}', "--batch-size", "8")
_IMAGES = ("--workload", "image-cnn", "--params", '{"num_train_images": 512, "width": 16}', "--batch-size", "64",
           "--num-dataloader-workers", "2", "--pin-memory")


def loop_runs(gpu: bool, num_gpus: int, bf16: bool) -> dict[str, LoopRun]:
    """The loop runs the checks read their evidence from (each a fresh process group)."""
    if not gpu:
        return {"ddp": LoopRun((*_TINY_LM, "--precision", "32"), 2), "bf16": LoopRun((*_TINY_LM, "--precision", "bf16-mixed"), 1),
                "compile": LoopRun((*_TINY_LM, "--precision", "32", "--compile"), 1)}
    runs = {"ddp": LoopRun((*_IMAGES, "--precision", "16-mixed"), max(1, num_gpus)),
            "tf32": LoopRun((*_TINY_LM, "--precision", "tf32"), 1),
            "compile": LoopRun((*_TINY_LM, "--precision", "bf16-mixed" if bf16 else "16-mixed", "--compile"), 1)}
    if bf16:
        runs["bf16"] = LoopRun((*_TINY_LM, "--precision", "bf16-mixed"), 1)
    return runs


def run_loop(run: LoopRun, data_dir: str, timeout_s: float) -> tuple[dict[str, Any] | None, str]:
    """Run the loop's check command and return (final report or None, the command, its last error line on failure).

    The command is killed, with every process it started, if it outlives `timeout_s`."""
    with tempfile.TemporaryDirectory(prefix="doctor-loop-") as tmp:
        out = Path(tmp) / "metrics.jsonl"
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={run.nproc}"] if run.nproc > 1 else []
        tail = ["--num-steps", "20", "--num-warmup-steps", "3", "--telemetry-period-s", "0.2", "--data-dir", data_dir]
        cmd = [sys.executable, *launcher, "-m", "trainables.launch", *run.args, *tail]
        shown = "python " + " ".join(a if " " not in a and "{" not in a else f"'{a}'" for a in cmd[1:])
        from trainables.doctor_checks import REPO, reap

        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([*cmd, "--metrics-path", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None, f"{shown}: did not finish in {timeout_s:.0f}s"
        finally:
            reap([proc])
        lines = out.read_text().splitlines() if out.exists() else []
        if proc.returncode or not lines:
            last = next((ln for ln in reversed(err.strip().splitlines()) if ln.strip()), "no output")
            return None, f"{shown}: exit {proc.returncode}: {last}"
        return json.loads(lines[-1]), shown


def _show(report: dict[str, Any], keys: tuple[str, ...]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{k}={fmt(report[k])}" for k in keys if k in report)


def _finite_loss(r: dict[str, Any]) -> bool:
    return isinstance(r.get(LOSS_TRAIN), (int, float)) and math.isfinite(r[LOSS_TRAIN])


def run_checks(facts: dict[str, Any], figures: dict[str, float], quick: bool,
               loop: Callable[[LoopRun, str, float], tuple[dict[str, Any] | None, str]] = run_loop,
               oom: Callable[[], tuple[str, str]] | None = None) -> list[Check]:
    """Check every GPU path the service depends on, on this node.

    On a CPU node only the CPU subset runs, and each GPU-only check is skipped with its reason. `loop` and `oom`
    are injectable (tests fake a GPU node)."""
    gpu = facts.get("device/type") == "cuda"
    num_gpus = int(facts.get("gpu/count", 0))
    bf16 = not gpu or float(facts.get("gpu/capability", "0")) >= 8.0
    with tempfile.TemporaryDirectory(prefix="doctor-data-") as data_dir:
        reports = {name: loop(run, data_dir, 300.0) for name, run in loop_runs(gpu, num_gpus, bf16).items()}
    checks: list[Check] = []

    def check(name: str, run: str, ok: Callable[[dict[str, Any]], bool], keys: tuple[str, ...]) -> None:
        report, shown = reports[run]
        if report is None:
            checks.append(Check(name, "fail", shown))
        else:
            checks.append(Check(name, "pass" if ok(report) and _finite_loss(report) else "fail",
                                f"{shown} -> {_show(report, (LOSS_TRAIN, *keys))}"))

    no_gpu = "skipped: no CUDA device on this node"
    if gpu and num_gpus >= 2:
        check("nccl_ddp", "ddp", lambda r: r.get(WORLD_SIZE) == num_gpus, (WORLD_SIZE, throughput_key("samples")))
    else:
        checks.append(Check("nccl_ddp", "skip", no_gpu if not gpu else "skipped: one GPU on this node, no NCCL peer"))
    if not gpu:
        check("gloo_ddp", "ddp", lambda r: r.get(WORLD_SIZE) == 2, (WORLD_SIZE, throughput_key("tokens")))
    if gpu:
        check("fp16_gradscaler", "ddp", lambda r: r.get("precision/grad_scaler") == "True", ("precision/grad_scaler", "precision/autocast_dtype"))
        check("tf32", "tf32", lambda r: r.get("precision/cuda_matmul_tf32") == "True" and r.get("precision/float32_matmul") == "high",
              ("precision/cuda_matmul_tf32", "precision/cudnn_tf32", "precision/float32_matmul"))
        check("channels_last", "ddp", lambda r: True, ("device/name", throughput_key("samples")))  # image-cnn runs channels_last on CUDA
    else:
        checks += [Check("fp16_gradscaler", "skip", no_gpu), Check("tf32", "skip", "skipped: tf32 is CUDA-only (Ampere+)"),
                   Check("channels_last", "skip", "skipped: the loop uses channels_last on CUDA only")]
    if bf16:
        check("bf16", "bf16", lambda r: r.get("precision/autocast_dtype") == "bfloat16", ("precision/autocast_dtype",))
    else:
        checks.append(Check("bf16", "skip", f"skipped: compute capability {facts.get('gpu/capability')} < 8.0"))
    check("compile", "compile", lambda r: True, (STEP_TIME_MS,))
    checks += _telemetry_checks(facts, reports["ddp"][0], gpu)
    checks.append(_oom_check(oom))
    mfu_run = ("bf16", "bf16-mixed") if bf16 else ("tf32", "tf32")
    if not gpu:
        mfu_run = ("ddp", "32")
    checks.append(_mfu_check(gpu, (mfu_run[1], reports[mfu_run[0]][0]), figures))
    return checks


def _telemetry_checks(facts: dict[str, Any], report: dict[str, Any] | None, gpu: bool) -> list[Check]:
    if not gpu:
        return [Check(n, "skip", "skipped: no CUDA device on this node") for n in ("nvml_uuid", "gpm", "energy")]
    if not facts.get("gpu/nvml"):
        return [Check(n, "fail", "NVML unavailable: install nvidia-ml-py and check the driver") for n in ("nvml_uuid", "gpm", "energy")]
    r = report or {}
    out = [Check("nvml_uuid", "pass" if GPU_UTIL_MEAN_PCT in r else "fail", _show(r, (GPU_UTIL_MEAN_PCT, GPU_POWER_MEAN_W, "device/driver")) or "no gpu/* metric in the loop's report")]
    if facts.get("gpu/gpm"):
        out.append(Check("gpm", "pass" if GPU_SM_ACTIVE_PCT in r else "fail", _show(r, (GPU_SM_ACTIVE_PCT, GPU_TENSOR_ACTIVE_PCT)) or "NVML offers GPM but the loop reported none"))
    else:
        out.append(Check("gpm", "skip", "skipped: this GPU has no GPM (Hopper and later)"))
    out.append(Check("energy", "pass" if r.get(ENERGY_TOTAL_J, 0) > 0 else "fail", _show(r, (ENERGY_TOTAL_J,)) or "no energy/total_j in the loop's report"))
    return out


def _oom_check(oom: Callable[[], tuple[str, str]] | None) -> Check:
    from sweeps.service.failures import classify

    if oom is None:
        from trainables.doctor_checks import Device, provoke_oom

        def oom() -> tuple[str, str]:
            return provoke_oom(Device.local()[0])

    try:
        name, message = oom()
    except Exception as exc:  # noqa: BLE001 - a check that cannot run is a failed check
        return Check("oom", "fail", f"{type(exc).__name__}: {exc}")
    # The service classifies by type name and message: rebuild the exception as the worker raised it.
    kind, reason = classify(type(name, (RuntimeError,), {})(message))
    return Check("oom", "pass" if kind == "oom" else "fail", f"classified {kind}: {reason[:200]}")


def _mfu_check(gpu: bool, run: tuple[str, dict[str, Any] | None], figures: dict[str, float]) -> Check:
    precision, report = run
    if report is None:
        return Check("mfu", "fail", "the loop run it reads from failed")
    sol = score(report, {"precision": precision, "cpus_per_worker": 1}, figures).get(SOL_PCT)
    ev = _show(report, (TFLOPS, MFU_PCT))
    if sol is not None:
        ev += f", {SOL_PCT}={sol:.3g} (against this node's measured {precision} peak)"
    ok = MFU_PCT in report if gpu else sol is not None
    return Check("mfu", "pass" if ok else "fail", ev or "no perf/tflops_per_s in the loop's report")


# --- the whole check: local or one task per node ------------------------------------------------


def run_local(quick: bool, gpu_checks: bool, storage_path: str) -> dict[str, Any]:
    """Measure this machine in this process."""
    node = node_task(quick, gpu_checks, storage_path)
    node["node"] = node["facts"]["host/name"]
    return {"nodes": [node], "findings": []}


def run_cluster(address: str, quick: bool, gpu_checks: bool, storage_path: str) -> dict[str, Any]:
    """Run the checks as one task per alive node of the cluster at `address`, pinned to it.

    A node that dies or hangs mid-check is a finding."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from sweeps.service.resources import local_runtime_env

    ours = not ray.is_initialized()  # a caller's (or a test's) connection is used and left open
    if ours:
        ray.init(address=address, runtime_env=local_runtime_env(), logging_level=logging.WARNING)
    try:
        pending: dict[Any, str] = {}
        labels: dict[str, str] = {}  # node id: how the report names the node
        measured_types: set[str] = set()
        task = ray.remote(node_task)
        for n in (n for n in ray.nodes() if n.get("Alive")):
            res = n.get("Resources", {})
            gpu_type = next((k for k in res if k.startswith("accelerator_type:")), None)
            measure_peak = gpu_type is None or gpu_type not in measured_types  # one peak per GPU type
            measured_types.add(gpu_type or "")
            ref = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                               num_cpus=1, num_gpus=int(res.get("GPU", 0)), max_retries=0,
                               ).remote(quick, gpu_checks, storage_path, measure_peak)
            pending[ref] = labels[n["NodeID"]] = f"{n.get('NodeManagerAddress', '?')} ({n['NodeID'][:8]})"
        report = gather(pending, ray.wait, ray.get, ray.cancel,
                        NODE_TIMEOUT_S[quick] + (GPU_CHECKS_TIMEOUT_S if gpu_checks else 0))
        if is_uri(storage_path):  # each node wrote there itself, with its own credentials (host/storage_writable)
            return report
        if address.startswith("ray://"):  # this process's disk is not the cluster's: a marker here proves nothing
            report["findings"].append(f"storage_path {storage_path}: whether every node sees it was not checked "
                                      "through a Ray client (run the doctor on the head: --address auto)")
            return report
        report["findings"] += shared_storage_findings(storage_path, report["nodes"], labels)
        return report
    finally:
        if ours:
            ray.shutdown()


def shared_storage_findings(storage_path: str, nodes: list[dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """Whether each node sees this process's local `storage_path`, asked as `sweeps run` asks before trial 1.

    Each node's report gets the fact `host/storage_shared` (yes, or no and why); a node that does not see it is a
    finding naming it. The nodes are this cluster's working ones (ids in `labels`: id -> the report's name)."""
    from sweeps.service.shared_storage import unseen_by, working_nodes

    root = Path(storage_path).resolve()
    root.mkdir(parents=True, exist_ok=True)
    unseen = unseen_by(root, [n for n in working_nodes() if n["NodeID"] in labels])
    by_label = {labels[node_id]: why for node_id, why in unseen.items()}
    for node in nodes:
        if node["node"] in labels.values():
            node["facts"]["host/storage_shared"] = f"no: {by_label[node['node']]}" if node["node"] in by_label else "yes"
    return [f"node {label}: storage_path {root} is not visible there ({why}): each rank writes its trace and "
            "checkpoints there on its own node; give a storage_path every node mounts at the same path, or a URI "
            "(s3://, gs://)" for label, why in sorted(by_label.items())]


def gather(pending: dict[Any, str], wait: Callable[..., tuple[list[Any], list[Any]]], get: Callable[[Any], Any],
           cancel: Callable[..., Any], timeout_s: float) -> dict[str, Any]:
    """Collect each node's report as its task ends.

    A task that raised (its node died, its worker crashed) or outlived `timeout_s` becomes a finding naming
    the node."""
    nodes, findings = [], []
    deadline = time.monotonic() + timeout_s
    left = list(pending)
    while left and time.monotonic() < deadline:
        done, left = wait(left, num_returns=1, timeout=max(0.1, deadline - time.monotonic()))
        for ref in done:
            try:
                node = get(ref)
            except Exception as exc:  # noqa: BLE001 - NodeDiedError, WorkerCrashedError, a task error: all findings
                findings.append(f"node {pending[ref]}: the check did not finish ({type(exc).__name__}: "
                                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})")
                continue
            node["node"] = pending[ref]
            nodes.append(node)
    for ref in left:
        cancel(ref, force=True)
        findings.append(f"node {pending[ref]}: no answer in {timeout_s:.0f}s (busy GPUs, or the node is hung); cancelled")
    return {"nodes": nodes, "findings": findings}


# --- what is shown and kept -----------------------------------------------------------------------


def hardware_figures(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per hardware key, each figure's median over that key's nodes (what a trial there is scored against)."""
    by_key: dict[str, dict[str, list[float]]] = {}
    for node in report["nodes"]:
        for k, v in node["figures"].items():
            by_key.setdefault(node["hardware_key"], {}).setdefault(k, []).append(v)
    return {key: {k: statistics.median(vs) for k, vs in figs.items()} for key, figs in by_key.items()}


def table(report: dict[str, Any]) -> str:
    """The figures (one column per node), then what was skipped and why, findings and checks."""
    nodes = report["nodes"]
    lines = []
    keys = sorted({k for n in nodes for k in n["figures"]})
    head = ["figure", *[n["node"] for n in nodes]]
    rows = [[k, *[f"{n['figures'][k]:.4g}" if k in n["figures"] else "-" for n in nodes]] for k in keys]
    facts = ("device/name", "host/cores_usable", "host/cpu_isa", KERNEL_ENV_FACT, "host/shm_gib", "host/disk_free_gib",
             "host/storage_writable", "host/storage_shared", "gpu/count",
             "gpu/memory_gib", "gpu/capability", "gpu/driver", "gpu/cuda", "gpu/nccl", "gpu/nvml", "gpu/gpm", "doctor/elapsed_s")
    rows += [[k, *[str(n["facts"].get(k, "-")) for n in nodes]] for k in facts if any(k in n["facts"] for n in nodes)]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for n in nodes:
        for k, why in n["skipped"].items():
            lines.append(f"not measured on {n['node']}: {k}: {why}")
        for c in n.get("checks", []):
            lines.append(f"[{c['status'].upper():4}] {n['node']} {c['name']}: {c['evidence']}")
    for f in [*report["findings"], *(f"{n['node']}: {f}" for n in nodes for f in n["findings"])]:
        lines.append(f"FINDING {f}")
    return "\n".join(lines)


def evidence_markdown(report: dict[str, Any], command: str) -> str:
    """The `--gpu-checks` evidence file (see docs/gpu-evidence.md): date, command, machine, each check."""
    out = [f"## {report['date']} — `sweeps doctor --gpu-checks`", "", f"Command: `{command}`", ""]
    for n in report["nodes"]:
        f = n["facts"]
        out += [f"### {n['node']}: {f.get('device/name')} x{f.get('gpu/count') or 'CPU only'}", "",
                f"driver {f.get('gpu/driver', '-')}, CUDA {f.get('gpu/cuda', '-')}, NCCL {f.get('gpu/nccl', '-')}, "
                f"torch {f.get('host/torch')}, NVML {f.get('gpu/nvml', '-')}, GPM {f.get('gpu/gpm', '-')}", "",
                "| check | result | evidence |", "|---|---|---|"]
        out += [f"| {c['name']} | {c['status']} | {c['evidence'].replace('|', '/')} |" for c in n.get("checks", [])]
        out.append("")
    return "\n".join(out)


def log_mlflow(report: dict[str, Any], tracking_uri: str) -> str:
    """Log a doctor report to MLflow and return the run id.

    One run per check (tag `doctor`); one hardware key's figures as its metrics, or with several keys a
    child run per key. The whole report is the run's `doctor.json` artifact."""
    from mlflow.entities import Metric, RunTag

    from sweeps.store import open_store
    from sweeps.tracking import _artifact_location
    from trainables.contract import is_metric

    client = open_store(tracking_uri)
    exp = client.get_experiment_by_name(DOCTOR_EXPERIMENT)
    exp_id = exp.experiment_id if exp else client.create_experiment(
        DOCTOR_EXPERIMENT, artifact_location=_artifact_location(tracking_uri, DOCTOR_EXPERIMENT),
        tags={"mlflow.experimentKind": "custom_model_development"})
    per_key = hardware_figures(report)
    now = int(time.time() * 1000)
    note = "```\n" + table(report) + "\n```"
    tags = {DOCTOR_TAG: "true", "doctor.quick": str(report["quick"]), "doctor.nodes": str(len(report["nodes"])),
            "doctor.findings": str(len(report["findings"]) + sum(len(n["findings"]) for n in report["nodes"])),
            "mlflow.note.content": note}
    if len(per_key) == 1:
        tags[HARDWARE_TAG] = next(iter(per_key))
    parent = client.create_run(exp_id, run_name=f"doctor {report['date']}", tags=tags).info.run_id
    targets = {next(iter(per_key)): parent} if len(per_key) == 1 else {
        key: client.create_run(exp_id, run_name=key, tags={DOCTOR_TAG: "true", HARDWARE_TAG: key,
                                                          "mlflow.parentRunId": parent}).info.run_id for key in per_key}
    for key, run_id in targets.items():
        facts = next(n["facts"] for n in report["nodes"] if n["hardware_key"] == key)
        client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in per_key[key].items() if is_metric(k, v)],
                         tags=[RunTag(k, str(v)[:5000]) for k, v in facts.items()])
        if run_id != parent:
            client.set_terminated(run_id)
    client.log_text(parent, json.dumps(report, indent=2, default=str), "doctor.json")
    client.set_terminated(parent, "FAILED" if any_failed(report) else "FINISHED")
    return parent


def any_failed(report: dict[str, Any]) -> bool:
    """A lost node or a failed check (findings about the machine alone do not fail the command)."""
    return bool(report["findings"]) or any(c["status"] == "fail" for n in report["nodes"] for c in n.get("checks", []))


@dataclass(frozen=True)
class Ask:
    """What `sweeps doctor` was asked: how much to measure, where, where to write and log, in the user's words."""

    quick: bool = False
    gpu_checks: bool = False
    address: str | None = None  # a Ray cluster: one check per node
    json_path: str = "doctor.json"
    tracking_uri: str | None = None  # None: do not log to MLflow
    storage_path: str = "ray_results"
    command: str = "sweeps doctor"


def doctor(ask: Ask) -> int:
    """The `sweeps doctor` command: measure, print, write JSON (and the evidence file), log to MLflow."""
    quick, gpu_checks, address, json_path = ask.quick, ask.gpu_checks, ask.address, ask.json_path
    tracking_uri, storage_path, command = ask.tracking_uri, ask.storage_path, ask.command
    t0 = time.perf_counter()
    report = (run_cluster(address, quick, gpu_checks, storage_path) if address
              else run_local(quick, gpu_checks, storage_path))
    report.update(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), command=command, quick=quick,
                  elapsed_s=round(time.perf_counter() - t0, 1))
    print(table(report))
    path = Path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nJSON: {path}")
    if gpu_checks:
        evidence = path.with_name(path.stem + "-evidence.md")
        evidence.write_text(evidence_markdown(report, command) + "\n")
        print(f"Evidence (paste into docs/gpu-evidence.md): {evidence}")
    if tracking_uri:
        try:
            run_id = log_mlflow(report, tracking_uri)
            print(f"MLflow: doctor run {run_id} in {tracking_uri} (experiment {DOCTOR_EXPERIMENT})")
        except Exception as exc:  # noqa: BLE001 - the figures are printed and written; the store is a finding
            print(f"FINDING MLflow store {tracking_uri} not written: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1 if any_failed(report) else 0
