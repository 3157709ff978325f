"""What one node can do, measured: the `sweeps doctor` figures (torch side; never imports Ray Tune).

Figures are warm, synchronised and the best of several sustained windows. A figure that cannot be
measured here is absent from `figures` and named in `skipped` with the reason, never a made-up 0.
Figure keys follow the metric vocabulary (`group/name_unit`): matmul peaks per device on a GPU
(`matmul/bf16_tflops_per_s`) and per core, single-threaded, on a CPU (`..._per_core`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]
_GIB = 1024**3
SHM_MIN_GIB = 1.0  # below this, loader workers passing batches through /dev/shm die (docker's default is 64 MiB)
LABELS = {"32": "fp32", "tf32": "tf32", "16-mixed": "fp16", "bf16-mixed": "bf16"}  # precision -> figure label
_DTYPES = {"32": torch.float32, "tf32": torch.float32, "16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}

Timer = Callable[[Callable[[], Any], int], float]  # (fn, repeats) -> seconds for all repeats, device work done


class CheckFailed(RuntimeError):
    """A measurement that could not be taken; its message is the finding."""


@dataclass(frozen=True)
class Budget:
    """How long each measurement may take: `QUICK` keeps a node under ~20 s, `FULL` under ~2 min."""

    matmul_s: float  # per precision, all sizes
    cpu_sizes: tuple[int, ...]
    gpu_sizes: tuple[int, ...]
    copy_mib: tuple[int, ...]
    allreduce_bytes: tuple[int, ...]
    allreduce_iters: int
    decode_s: float
    decode_images: int


QUICK = Budget(0.9, (256, 512), (2048, 4096), (64,), (1 << 16, 1 << 22), 5, 1.0, 96)
FULL = Budget(6.0, (256, 512, 1024), (2048, 4096, 8192), (64, 256), (1 << 16, 1 << 20, 1 << 24, 1 << 26), 20, 6.0, 512)


def cpu_timer(fn: Callable[[], Any], repeats: int) -> float:
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return time.perf_counter() - t0


def cuda_timer(fn: Callable[[], Any], repeats: int) -> float:
    """CUDA events around the queued work: the host's view of an asynchronous launch would be too short."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0


def _host_buffer(nbytes: int, pinned: bool) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)


@dataclass
class Device:
    """Where a measurement runs and how it is timed (tests pass a fake CUDA timer and host buffers)."""

    kind: str  # "cpu" | "cuda"
    torch_device: torch.device
    name: str
    capability: tuple[int, int] | None = None
    timer: Timer = cpu_timer
    host_buffer: Callable[[int, bool], torch.Tensor] = _host_buffer
    memory_gib: float | None = None

    @staticmethod
    def local() -> list[Device]:
        if not torch.cuda.is_available():
            from trainables.devinfo import cpu_model

            return [Device("cpu", torch.device("cpu"), cpu_model())]
        return [Device("cuda", torch.device("cuda", i), torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i),
                       cuda_timer, memory_gib=round(torch.cuda.get_device_properties(i).total_memory / _GIB, 1))
                for i in range(torch.cuda.device_count())]


def precisions(dev: Device, cpu_flags: str = "") -> dict[str, str | None]:
    """Each precision -> None where `dev` runs it natively, else the reason it is not measured."""
    if dev.kind == "cpu":
        native16 = any(f in cpu_flags.split() for f in ("avx512_fp16", "amx_fp16"))
        return {"32": None, "bf16-mixed": None, "tf32": "tf32 is CUDA-only (Ampere+): a CPU has no TF32 mode",
                "16-mixed": None if native16 else "no avx512_fp16/amx_fp16 in this CPU's ISA: no native fp16 matmul to measure"}
    major = (dev.capability or (0, 0))[0]
    ampere = None if major >= 8 else f"{dev.name} is compute capability {major}.x; needs >= 8.0"
    return {"32": None, "tf32": ampere, "16-mixed": None, "bf16-mixed": ampere}


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `n` (None: unchanged), restored after."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def tf32(on: bool) -> Iterator[None]:
    """TF32 matmuls on or off (strict fp32 must not be measured with TF32), restored after."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[:2]
        torch.set_float32_matmul_precision(before[2])


def best_rate(timer: Timer, fn: Callable[[], Any], work: float, budget_s: float, windows: int = 3) -> float:
    """`work` per second of the best of `windows` sustained windows, after two warm calls."""
    timer(fn, 1)
    per_call = max(timer(fn, 1), 1e-9)
    reps = max(1, int(budget_s / windows / per_call))
    return max(work * reps / max(timer(fn, reps), 1e-12) for _ in range(windows))


def matmul_peak(dev: Device, precision: str, sizes: tuple[int, ...], budget_s: float) -> tuple[float, int]:
    """Best dense matmul FLOP/s at `precision` over `sizes` (square n x n @ n x n), and the n it took."""
    dtype = _DTYPES[precision]
    best, best_n = 0.0, 0
    with tf32(precision == "tf32"):
        for n in sizes:
            a = torch.randn(n, n, device=dev.torch_device).to(dtype)
            b, out = torch.randn_like(a), torch.empty_like(a)
            rate = best_rate(dev.timer, functools.partial(torch.mm, a, b, out=out), 2.0 * n**3, budget_s / len(sizes))
            if rate > best:
                best, best_n = rate, n
            del a, b, out
    return best, best_n


def copy_bandwidth(dev: Device, sizes_mib: tuple[int, ...], budget_s: float) -> dict[str, float]:
    """Host<->device copy GB/s, pinned and pageable, best over `sizes_mib` (a GPU only)."""
    out: dict[str, float] = {}
    for pinned in (True, False):
        kind = "pinned" if pinned else "pageable"
        for mib in sizes_mib:
            nbytes = mib * 1024**2
            host = dev.host_buffer(nbytes, pinned)
            device = torch.empty(nbytes, dtype=torch.uint8, device=dev.torch_device)
            each = budget_s / (4 * len(sizes_mib))
            h2d = best_rate(dev.timer, functools.partial(device.copy_, host, non_blocking=pinned), nbytes / 1e9, each)
            d2h = best_rate(dev.timer, functools.partial(host.copy_, device, non_blocking=pinned), nbytes / 1e9, each)
            out[f"copy/h2d_{kind}_gb_per_s"] = max(out.get(f"copy/h2d_{kind}_gb_per_s", 0.0), h2d)
            out[f"copy/d2h_{kind}_gb_per_s"] = max(out.get(f"copy/d2h_{kind}_gb_per_s", 0.0), d2h)
            del host, device
    return out


def decode_rate(budget_s: float, num_images: int, image_size: int = 32) -> float:
    """Measure the samples/s one core decodes and augments with image-cnn's own pipeline.

    PNG decode, reflect-pad, random crop, flip, normalise, on freshly written files: one loader worker's ceiling."""
    from trainables.workloads.declared import ImageCnnParams
    from trainables.workloads.image_cnn import ImageFolderDataset, ensure_image_files

    with tempfile.TemporaryDirectory(prefix="doctor-images-") as tmp, threads(1):
        root = ensure_image_files(ImageCnnParams(image_size=image_size, num_train_images=num_images, num_val_images=1),
                                  tmp, seed=0)
        ds = ImageFolderDataset(root / "train", train=True)
        index = iter(range(10**9))
        return best_rate(cpu_timer, lambda: ds[next(index) % len(ds)], 1.0, budget_s)


# --- all-reduce over local processes ------------------------------------------------------


def allreduce_busbw(world_size: int, backend: str, sizes: tuple[int, ...], iters: int,
                    timeout_s: float = 60.0) -> dict[int, float]:
    """All-reduce bus bandwidth GB/s per message size (bytes), `world_size` local processes.

    Bus bandwidth = bytes / time x 2(n-1)/n (the nccl-tests convention: comparable across world
    sizes). The parent holds the rendezvous store on a free port; every child is reaped, killed if
    it outlives `timeout_s`."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "trainables.doctor_checks", "allreduce", str(store.port), str(world_size), backend,
           ",".join(map(str, sizes)), str(iters)]
    procs = [subprocess.Popen([*cmd, str(rank)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for rank in range(world_size)]
    outs: list[tuple[str, str]] = []
    try:
        deadline = time.monotonic() + timeout_s
        for p in procs:
            outs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic())))
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"all-reduce over {world_size} {backend} ranks did not finish in {timeout_s:.0f}s") from exc
    finally:
        reap(procs)
        del store
    failed = [(i, p.returncode, err) for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)) if p.returncode]
    if failed:
        rank, rc, err = failed[0]
        raise CheckFailed(f"all-reduce rank {rank} exited {rc}: {err.strip().splitlines()[-1] if err.strip() else ''}")
    return {int(k): v for k, v in json.loads(outs[0][0].strip().splitlines()[-1]).items()}


def reap(procs: list[subprocess.Popen[Any]]) -> None:
    """Kill (their whole session) and wait for every process still running."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
        p.wait()


def _allreduce_rank(port: int, world: int, backend: str, sizes: list[int], iters: int, rank: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60))
    dist.init_process_group(backend, store=dist.PrefixStore("doctor", store), rank=rank, world_size=world)
    sync = (lambda: torch.cuda.synchronize(device)) if backend == "nccl" else (lambda: None)
    try:
        out: dict[int, float] = {}
        for nbytes in sizes:
            t = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
            for _ in range(2):
                dist.all_reduce(t)
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            sync()
            elapsed = torch.tensor([time.perf_counter() - t0], device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time is the collective's
            out[nbytes] = nbytes * iters / elapsed.item() * 2 * (world - 1) / world / 1e9
        if rank == 0:
            print(json.dumps(out), flush=True)
    finally:
        dist.destroy_process_group()


def world_sizes(kind: str, num_devices: int) -> list[int]:
    """The world sizes a sweep would use on this node: 2 gloo ranks on a CPU; 2, 4, ... and all GPUs."""
    if kind == "cpu":
        return [2]
    sizes = [n for n in (2, 4, 8, 16) if n < num_devices] + ([num_devices] if num_devices >= 2 else [])
    return sorted(set(sizes))


# --- what the machine offers ----------------------------------------------------------------


def _disk_free_gib(path: str) -> float:
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free / _GIB


def host_facts(storage_path: str, shm_path: str = "/dev/shm") -> tuple[dict[str, Any], list[str]]:
    """CPU, memory, /dev/shm and disk: facts, and findings (what would break a sweep here)."""
    import psutil

    from trainables.devinfo import cpu_isa_flags, cpu_model
    from trainables.storage import Storage, is_uri

    findings: list[str] = []
    facts: dict[str, Any] = {"host/name": socket.gethostname(), "host/cpu": cpu_model(), "host/cpu_isa": cpu_isa_flags(),
                             "host/cores": os.cpu_count() or 0, "host/cores_usable": len(os.sched_getaffinity(0)),
                             "host/memory_gib": round(psutil.virtual_memory().total / _GIB, 1),
                             "host/python": platform.python_version(), "host/torch": str(torch.__version__)}
    isa = facts["host/cpu_isa"].split()
    facts["host/amx"] = "amx_bf16" in isa
    facts["host/avx512_bf16"] = "avx512_bf16" in isa
    try:
        shm = shutil.disk_usage(shm_path).total / _GIB
        facts["host/shm_gib"] = round(shm, 3)
        if shm < SHM_MIN_GIB:
            findings.append(f"{shm_path} is {shm * 1024:.0f} MiB: dataloader workers pass batches through it and die "
                            f"(bus error) when it fills; give the container more (docker --shm-size=8g, Kubernetes "
                            f"an emptyDir medium: Memory) or use num_dataloader_workers 0")
    except OSError as exc:
        findings.append(f"{shm_path} cannot be read ({exc.strerror}): dataloader workers need shared memory")
    try:
        if is_uri(storage_path):  # no disk of this node's: whether it writes there, with this node's credentials
            Storage(storage_path).check_writable()
            return {**facts, "host/storage_writable": True}, findings
        facts["host/disk_free_gib"] = round(_disk_free_gib(storage_path), 1)
        if facts["host/disk_free_gib"] < 5:
            findings.append(f"{facts['host/disk_free_gib']} GiB free under {storage_path}: checkpoints and Ray's logs "
                            "will fill it (sweeps stop with disk_full)")
    except OSError as exc:  # a URI's StorageError: one line naming it and the credentials variables
        findings.append(str(exc) if is_uri(storage_path) else f"free disk under {storage_path} unknown: {exc}")
    return facts, findings


def gpu_facts(devices: list[Device], nvml: Any, uuids: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Return GPU model, count, memory, CUDA/NCCL, and what NVML offers for each GPU found by UUID.

    nvml None: NVML missing or failing, a finding: GPU telemetry will be absent."""
    from trainables.sampler import GpuIdentity, NvmlDevice

    gpus = [d for d in devices if d.kind == "cuda"]
    facts: dict[str, Any] = {"gpu/count": len(gpus)}
    if not gpus:
        return facts, []
    findings: list[str] = []
    facts["gpu/models"] = ", ".join(sorted({d.name for d in gpus}))
    facts["gpu/capability"] = ".".join(map(str, gpus[0].capability or (0, 0)))
    if gpus[0].memory_gib is not None:
        facts["gpu/memory_gib"] = gpus[0].memory_gib
    facts["gpu/cuda"] = str(torch.version.cuda)
    with contextlib.suppress(Exception):  # a CPU build has no NCCL: the fact is then absent
        facts["gpu/nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    facts["gpu/nvml"] = nvml is not None
    if nvml is None:
        findings.append("NVML unavailable (nvidia-ml-py missing or the driver library failed): GPU utilisation, "
                        "power, energy and GPM metrics will be absent from every trial")
        return facts, findings
    gpm = []
    for uuid in uuids:
        try:
            dev = NvmlDevice(nvml, GpuIdentity(uuid=uuid))
        except (LookupError, nvml.NVMLError) as exc:
            findings.append(f"GPU {uuid}: not found through NVML by UUID ({exc}): its telemetry will be absent")
            continue
        facts["gpu/driver"] = dev.facts["device/driver"]
        gpm.append(dev.gpm)
        dev.close()
    facts["gpu/gpm"] = bool(gpm) and all(gpm)
    return facts, findings


def local_uuids() -> list[str]:
    return [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]


@dataclass
class NodeReport:
    """One node's figures (floats), facts, what was skipped and why, and findings."""

    figures: dict[str, float] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)

    def attempt(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run one measurement; its failure is a finding named `name`, never a traceback.

        The doctor's whole point is to report what fails."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - every failure here is a finding about the machine
            self.skipped[name] = f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            logger.warning("doctor: %s failed: %s", name, exc)
            return None


def measure_node(quick: bool, storage_path: str, measure_peak: bool = True, devices: list[Device] | None = None,
                 nvml_loader: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Everything `sweeps doctor` measures on this node, as a JSON-able dict."""
    from trainables.sampler import load_nvml

    t0 = time.perf_counter()
    budget = QUICK if quick else FULL
    rep = NodeReport()
    devices = devices if devices is not None else Device.local()
    facts, findings = host_facts(storage_path)
    rep.facts.update(facts)
    rep.findings += findings
    dev = devices[0]
    rep.facts["device/type"], rep.facts["device/name"] = dev.kind, dev.name
    if dev.kind == "cuda":
        nvml = (nvml_loader or load_nvml)()
        gfacts, gfindings = gpu_facts(devices, nvml, local_uuids())
        rep.facts.update(gfacts)
        rep.findings += gfindings
    else:
        rep.facts["gpu/count"] = 0
        rep.findings.append("no CUDA device: GPU figures (tf32, copies, NCCL) are not measured on this node")
    _measure_compute(rep, dev, budget, measure_peak)
    release_device_memory()  # the NCCL ranks below need the GPUs' memory, not this process's cache
    _measure_transfers(rep, devices, budget)
    rate = rep.attempt("input/decode_samples_per_s_per_core", lambda: decode_rate(budget.decode_s, budget.decode_images))
    if rate:
        rep.figures["input/decode_samples_per_s_per_core"] = rate
        rep.figures["input/decode_image_size"] = 32.0
    rep.facts["doctor/elapsed_s"] = round(time.perf_counter() - t0, 1)
    return {"figures": rep.figures, "facts": rep.facts, "skipped": rep.skipped, "findings": rep.findings}


def _measure_compute(rep: NodeReport, dev: Device, budget: Budget, measure_peak: bool) -> None:
    suffix = "_per_core" if dev.kind == "cpu" else ""
    sizes = budget.cpu_sizes if dev.kind == "cpu" else budget.gpu_sizes
    for precision, reason in precisions(dev, rep.facts.get("host/cpu_isa", "")).items():
        key = f"matmul/{LABELS[precision]}_tflops_per_s{suffix}"
        if reason is not None or not measure_peak:
            rep.skipped[key] = reason or "measured once per hardware type, on another node"
            continue
        if dev.torch_device.type == "cuda":
            torch.cuda.set_device(dev.torch_device)
        with threads(1 if dev.kind == "cpu" else None):  # CPU peaks are per core: one thread
            got = rep.attempt(key, functools.partial(matmul_peak, dev, precision, sizes, budget.matmul_s))
        if got:
            rep.figures[key] = got[0] / 1e12
            rep.facts[f"matmul/{LABELS[precision]}_size"] = got[1]


def _measure_transfers(rep: NodeReport, devices: list[Device], budget: Budget) -> None:
    dev = devices[0]
    if dev.kind == "cuda":
        got = rep.attempt("copy", lambda: copy_bandwidth(dev, budget.copy_mib, budget.matmul_s))
        rep.figures.update(got or {})
    else:
        rep.skipped["copy/h2d_pinned_gb_per_s"] = "no accelerator: host and device memory are the same"
    backend = "nccl" if dev.kind == "cuda" else "gloo"
    sizes = world_sizes(dev.kind, len(devices))
    if not sizes:
        rep.skipped["allreduce"] = f"one {dev.name}: no all-reduce between GPUs on this node"
    for world in sizes:
        got = rep.attempt(f"allreduce/w{world}", functools.partial(allreduce_busbw, world, backend, budget.allreduce_bytes,
                                                                   budget.allreduce_iters))
        for nbytes, busbw in (got or {}).items():
            rep.figures[f"allreduce/{backend}_w{world}_{_size_label(nbytes)}_busbw_gb_per_s"] = busbw


def _size_label(nbytes: int) -> str:
    return f"{nbytes >> 20}mib" if nbytes >= 1 << 20 else f"{nbytes >> 10}kib"


def provoke_oom(dev: Device) -> tuple[str, str]:
    """Ask the device's allocator for far more than it has, and return (exception type name, message).

    On a GPU it fills the device 1 GiB at a time (the caching allocator's real out-of-memory path), then frees
    all of it; on a CPU one 1 EiB request fails up front (filling host memory would wake the kernel's OOM killer,
    not torch's allocator)."""
    held: list[torch.Tensor] = []
    try:
        if dev.kind == "cuda":
            for _ in range(1 << 16):
                held.append(torch.empty(1 << 30, dtype=torch.uint8, device=dev.torch_device))
        torch.empty(1 << 60, dtype=torch.uint8, device=dev.torch_device)
    except Exception as exc:  # noqa: BLE001 - the failure is the evidence; the service classifies it
        return type(exc).__name__, str(exc)
    finally:
        held.clear()
        release_device_memory()
    raise CheckFailed("an allocation of 1 EiB succeeded: the allocator did not fail")


def release_device_memory() -> None:
    """Give the GPU back its cached blocks: a Ray worker process outlives the task that measured."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: list[str]) -> None:
    if argv[0] == "allreduce":
        port, world, backend, sizes, iters, rank = argv[1:7]
        _allreduce_rank(int(port), int(world), backend, [int(s) for s in sizes.split(",")], int(iters), int(rank))


if __name__ == "__main__":
    main(sys.argv[1:])
