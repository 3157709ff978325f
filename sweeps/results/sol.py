"""Speed of light: a trial's figures against what its hardware measured it can do (`sweeps doctor`).

Torch-free at import: `quick_figures` imports the measuring code when called.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from trainables.contract import (
    H2D_BW_PCT,
    H2D_GB_PER_S,
    INPUT_SOL_PCT,
    SOL_PCT,
    TFLOPS,
    WORLD_SIZE,
    matmul_emulated_key,
    matmul_of_fp32_key,
    throughput_key,
)

logger = logging.getLogger(__name__)

DOCTOR_EXPERIMENT = "sweeps-doctor"
DOCTOR_TAG = "doctor"  # "true" on every doctor run
HARDWARE_TAG = "doctor.hardware_key"  # on the run that carries one hardware type's figures as metrics
DECODE_RATE = "input/decode_samples_per_s_per_core"
DECODE_IMAGE_SIZE = "input/decode_image_size"
_LABELS = {"32": "fp32", "tf32": "tf32", "16-mixed": "fp16", "bf16-mixed": "bf16"}
MIXED = ("bf16-mixed", "16-mixed")  # the precisions a CPU may run emulated
KERNEL_ENV_FACT = "host/kernel_env"  # a doctor run's fact (and tag): the kernel-changing variables it measured under
NO_KERNEL_ENV = "none"
# Environment variables that change which CPU kernels torch runs, hence the peaks measured: oneDNN's ISA cap
# and hints (current and legacy names) and its default fp32 math mode (may compute fp32 in bf16), ATen's own
# dispatch level, MKL's ISA cap. `ONEDNN_MAX_CPU_ISA=AVX2` turns a native-bf16 Xeon into an emulating one.
KERNEL_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_CPU_ISA_HINTS", "DNNL_CPU_ISA_HINTS",
              "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def kernel_env(environ: Mapping[str, str] | None = None) -> str:
    """Return the kernel-changing variables set in `environ` (default: this process's) as `NAME=value` words.

    "" where none is: figures measured under one setting never stand for another."""
    env = os.environ if environ is None else environ
    return " ".join(f"{k}={env[k]}" for k in KERNEL_ENV if env.get(k))


def hardware_key(device_type: str, device_name: str) -> str:
    """Return what doctor figures are filed under: the device type and model.

    E.g. `cuda:NVIDIA H100 80GB HBM3` or `cpu:Intel(R) Xeon(R) Processor` (a trial's `device/type` and
    `device/name` tags give the same)."""
    return f"{device_type}:{device_name}"


def peak_key(precision: str, per_core: bool) -> str:
    return f"matmul/{_LABELS.get(precision, precision)}_tflops_per_s" + ("_per_core" if per_core else "")


def _num(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        f = float(v)
    except ValueError:
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None


EMULATED_BELOW_PCT = 25.0  # a mixed precision's matmul peak under this % of fp32's: emulated (see `emulated`)


def ratio_key(precision: str) -> str:
    return matmul_of_fp32_key(_LABELS.get(precision, precision))


def emulated_key(precision: str) -> str:
    return matmul_emulated_key(_LABELS.get(precision, precision))


def of_fp32_pct(d: Mapping[str, Any], precision: str) -> float | None:
    """Return a mixed `precision`'s per-core matmul peak as % of fp32's.

    Recorded (`ratio_key`, in figures or in a trial's metrics, which `score` copies it onto) or computed from the
    two peaks; None on a GPU, for any other precision, or where a peak is missing."""
    if precision not in MIXED:
        return None
    pct = _num(d, ratio_key(precision))
    if pct is not None:
        return pct
    mine, fp32 = _num(d, peak_key(precision, per_core=True)), _num(d, peak_key("32", per_core=True))
    return None if mine is None or not fp32 else 100.0 * mine / fp32


def emulated(d: Mapping[str, Any], precision: str) -> bool | None:
    """Tell whether a mixed `precision` looked emulated on the CPU that `d` (figures or a trial's metrics) describes.

    By measurement: its matmul peak under `EMULATED_BELOW_PCT` of fp32's. Measured emulated, bf16 ran at
    1-4% of fp32 (0.66-1.7 GFLOP/s per core); native, at 53% on an avx512_bf16 Xeon (84 vs 158: the
    quick 512-matmul under-reads native bf16) and far above 100% with AMX: a quarter leaves a wide margin
    either way. None where unknown (no claim either way)."""
    pct = of_fp32_pct(d, precision)
    return None if pct is None else pct < EMULATED_BELOW_PCT


def held_to(d: Mapping[str, Any], precision: str) -> str:
    """Return the precision whose peak a CPU trial at `precision` is scored against.

    That is fp32's for a mixed precision whose own measured peak is below it, else its own. An emulated
    bf16/fp16 kernel converts to fp32 and runs on the fp32 units (autocast leaves every op without a
    low-precision kernel in fp32 anyway), so no trial beats the fp32 peak that way, while the one single-core
    matmul the figures time can fall to a slower emulation kernel than a model's convolutions get: at 1.7 GFLOP/s
    per core (fp32 ~40) bf16 trials read 163-217% "of peak". A native kernel is at least as fast as fp32's in
    silicon, so its measured peak below fp32's under-reads it (see `emulated`); where it measures above, nothing
    changes."""
    pct = of_fp32_pct(d, precision)
    return "32" if pct is not None and pct < 100.0 else precision


def emulation_figures(figures: Mapping[str, Any]) -> dict[str, float]:
    """Return, per mixed precision whose peak and fp32's were measured (a CPU), how it compares with fp32.

    Its `ratio_key` (% of fp32's) and `emulated_key` (1.0 emulated, 0.0 native). Recorded beside the peaks;
    `score` copies them onto trials."""
    out: dict[str, float] = {}
    for p in MIXED:
        pct = of_fp32_pct(figures, p)
        if pct is not None:
            out[ratio_key(p)], out[emulated_key(p)] = pct, float(pct < EMULATED_BELOW_PCT)
    return out


def annotate_node(figures: dict[str, float], facts: dict[str, Any]) -> None:
    """Add to one doctor node's report what scoring reads from it.

    Its `emulation_figures` beside the peaks, and the kernel-changing variables it measured under
    (`KERNEL_ENV_FACT`, a tag on the run)."""
    figures.update(emulation_figures(figures))
    facts[KERNEL_ENV_FACT] = kernel_env() or NO_KERNEL_ENV


def _sol_pct(metrics: dict[str, Any], params: dict[str, Any], figures: dict[str, Any]) -> float | None:
    achieved, precision = _num(metrics, TFLOPS), params.get("precision")
    world = _num(metrics, WORLD_SIZE)
    if achieved is None or world is None or precision is None:
        return None
    per_core = _num(figures, peak_key(held_to(figures, str(precision)), per_core=True))
    if per_core is not None:  # a CPU trial: each rank runs cpus_per_worker threads
        threads = _num(params, "cpus_per_worker") or 1.0
        peak = per_core * world * threads
    else:
        per_device = _num(figures, peak_key(str(precision), per_core=False))
        if per_device is None:
            return None
        peak = per_device * world
    return 100.0 * achieved / peak if peak > 0 else None


def _input_sol_pct(metrics: dict[str, Any], params: dict[str, Any], figures: dict[str, Any]) -> float | None:
    rate, samples, world = _num(figures, DECODE_RATE), _num(metrics, throughput_key("samples")), _num(metrics, WORLD_SIZE)
    if params.get("workload") != "image-cnn" or rate is None or samples is None or world is None:
        return None
    size = _num(params, "workload.image_size") or 32.0  # image-cnn's default
    if _num(figures, DECODE_IMAGE_SIZE) != size:
        return None  # decode cost grows with the pixels: a rate for other images would mislead
    workers = max(1.0, _num(params, "num_dataloader_workers") or 0.0)
    return 100.0 * samples / (rate * workers * world)


def score(metrics: dict[str, Any], params: dict[str, Any], figures: dict[str, Any]) -> dict[str, float]:
    """Score a trial's speed of light against its hardware's doctor `figures`.

    The figures are `latest_figures` or `quick_figures`. Each metric is absent, never 0, where an input is missing.

    - `perf/sol_pct` = achieved FLOP/s (`perf/tflops_per_s`) / measured peak FLOP/s for the trial's
      `precision`. On a GPU the peak is the per-device matmul figure x `progress/world_size` (one GPU per
      rank). On a CPU the peak is the per-core figure (measured single-threaded) x `progress/world_size` x
      threads per rank (param `cpus_per_worker`, else 1); for bf16-mixed/16-mixed the per-core figure is
      the larger of that precision's and fp32's (`held_to`: an emulated precision is held to fp32's).
    - `matmul/<bf16|fp16>_of_fp32_pct`, `matmul/<bf16|fp16>_emulated` (CPU figures only): the figures'
      `emulation_figures`, copied onto every trial scored against them, so its verdict knows what this
      machine measured.
    - `perf/h2d_bw_pct` = the trial's `copy/h2d_gb_per_s` (host->device bytes per second of measured time,
      mean per rank; the loop reports it on CUDA only) / the measured h2d bandwidth, pinned or pageable as
      the trial's `pin_memory`.
    - `perf/input_sol_pct` = `throughput/samples_per_s` / (decode+augment samples/s per core x
      max(1, `num_dataloader_workers`) x `progress/world_size`), for `workload` image-cnn only and only when
      the doctor decoded images of the trial's `workload.image_size` (default 32). Meaningful for
      input-bound trials; near 100 means the loader workers are the ceiling.
    """
    out: dict[str, float] = emulation_figures(figures)
    sol = _sol_pct(metrics, params, figures)
    if sol is not None:
        out[SOL_PCT] = sol
    h2d = _num(metrics, H2D_GB_PER_S)
    bw = _num(figures, f"copy/h2d_{'pinned' if params.get('pin_memory') in (True, 'True', 'true') else 'pageable'}_gb_per_s")
    if h2d is not None and bw:
        out[H2D_BW_PCT] = 100.0 * h2d / bw
    inp = _input_sol_pct(metrics, params, figures)
    if inp is not None:
        out[INPUT_SOL_PCT] = inp
    return out


def latest_figures(tracking_uri: str, hardware_key: str, kernels: str | None = None) -> dict[str, float] | None:
    """Return the figures (metrics) of the newest doctor run for `hardware_key` in `tracking_uri`.

    None where the store has none (or cannot be read: scoring is then skipped, not the sweep). With `kernels`
    (this machine's `kernel_env()`), only a run measured under the same kernel-changing variables counts
    (a run that did not record them counts as measured under none); None: any run."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    try:
        exp = client.get_experiment_by_name(DOCTOR_EXPERIMENT)
        if exp is None:
            return None
        key = hardware_key.replace("'", "\\'")
        runs = client.search_runs([exp.experiment_id], f"tags.{DOCTOR_TAG} = 'true' and tags.`{HARDWARE_TAG}` = '{key}'",
                                  order_by=["attributes.start_time DESC"], max_results=1 if kernels is None else 50)
    except MlflowException as exc:
        logger.warning("doctor figures unreadable from %s: %s", tracking_uri, exc)
        return None
    same = [r for r in runs if kernels is None or r.data.tags.get(KERNEL_ENV_FACT, NO_KERNEL_ENV) == (kernels or NO_KERNEL_ENV)]
    return dict(same[0].data.metrics) if same else None


def quick_figures() -> dict[str, float]:
    """Measure a few figures here and now in <= 5 s on a CPU, for a sweep that finds no doctor run.

    The strict fp32 and bf16 matmul peaks (per core, single-threaded, on a CPU; per device on a GPU), fp16's
    too on a CPU with native fp16, whether each looked emulated (`emulation_figures`), and the image decode
    rate per core. Run `sweeps doctor` for the full set."""
    from trainables.devinfo import cpu_isa_flags
    from trainables.doctor_checks import Device, decode_rate, matmul_peak, precisions, threads

    dev = Device.local()[0]
    cpu = dev.kind == "cpu"
    out: dict[str, float] = {}
    native = precisions(dev, cpu_isa_flags() if cpu else "")
    with threads(1 if cpu else None):
        for precision in ("32", "bf16-mixed", *(("16-mixed",) if cpu else ())):
            if native.get(precision) is None:
                flops, _ = matmul_peak(dev, precision, (512,) if cpu else (4096,), 0.6)
                out[peak_key(precision, per_core=cpu)] = flops / 1e12
    out.update(emulation_figures(out))
    out[DECODE_RATE] = decode_rate(0.6, 32)
    out[DECODE_IMAGE_SIZE] = 32.0
    return out


def local_key() -> str:
    """This machine's hardware key (its first GPU where it has one, else its CPU)."""
    import torch

    from trainables.devinfo import cpu_model

    if torch.cuda.is_available():
        return hardware_key("cuda", torch.cuda.get_device_name(0))
    return hardware_key("cpu", cpu_model())


QUICK_MAX_AGE_S = 7 * 24 * 3600


def quick_cache_key(key: str) -> str:
    """Return what quick figures are cached under.

    The hardware key, torch's version and the kernel-changing variables (`kernel_env`): each picks other
    kernels, so other peaks (bf16 emulated or native)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "?"
    return f"{key} | torch {torch_version} | {kernel_env() or NO_KERNEL_ENV}"


_QUICK_MARK = "quick-figures: "  # the child's line of figures, whatever else it prints
_QUICK_CHILD = ("import json, os\nfrom sweeps.results.sol import quick_figures\n"
                f"print({_QUICK_MARK!r} + json.dumps({{'pid': os.getpid(), 'figures': quick_figures()}}))")


def measured_apart(timeout_s: float = 300.0) -> dict[str, float]:
    """Run `quick_figures()` in a process of its own and return what it measured.

    A sweep's driver that measured on its GPU itself would hold a CUDA context there for the whole sweep:
    memory the trials lose, and a process NVML lists beside each of them, so every trial read as contended
    (`contention/gpu_other_procs` 1; seen on an H100, 2026-11-28). The child's context ends with it. It imports
    this package from where this process did. A failure raises `RuntimeError` with the end of what it said."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    try:
        proc = subprocess.run([sys.executable, "-c", _QUICK_CHILD], capture_output=True, text=True,
                              timeout=timeout_s, check=False, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the quick figures' process took over {timeout_s:g} s") from None
    lines = [x for x in proc.stdout.splitlines() if x.startswith(_QUICK_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the quick figures' process exited {proc.returncode} without its figures: "
                           f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    said = json.loads(lines[-1].removeprefix(_QUICK_MARK))
    logger.debug("quick figures measured in process %s", said["pid"])
    return {k: float(v) for k, v in said["figures"].items()}


def cached_quick_figures(key: str) -> dict[str, float]:
    """Return this machine's quick figures (`measured_apart`), kept for a week in the user's cache.

    The cache is $XDG_CACHE_HOME/gpu-sweeps, else ~/.cache/gpu-sweeps, so each sweep does not pay the 3-5 s
    again; one file per `quick_cache_key` (figures measured under `ONEDNN_MAX_CPU_ISA=AVX2` never stand in
    for those measured without it, nor the other way round)."""
    import hashlib
    import json
    import time
    from pathlib import Path

    cache_key = quick_cache_key(key)
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-sweeps"
    path = root / f"quick-figures-{hashlib.sha1(cache_key.encode()).hexdigest()[:12]}.json"
    try:
        if time.time() - path.stat().st_mtime < QUICK_MAX_AGE_S:
            cached = json.loads(path.read_text())
            if cached.get("cache_key") == cache_key:
                return {k: float(v) for k, v in cached["figures"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    figures = measured_apart()
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"cache_key": cache_key, "hardware_key": key, "figures": figures}))
        tmp.replace(path)
    except OSError as exc:  # a read-only home: measured again next time
        logger.warning("could not cache the quick doctor figures in %s: %s", root, exc)
    return figures


def _emulation_note(figures: dict[str, float]) -> str:
    """What the sweep says up front about figures that show an emulated precision, and under which
    kernel-changing variables they were measured."""
    said = [f"; {_LABELS[p]} matmul at {pct:.2g}% of fp32's: emulated here, its trials are held to fp32's peak"
            for p in MIXED if emulated(figures, p) and (pct := of_fp32_pct(figures, p)) is not None]
    return "".join(said) + (f"; measured under {kernel_env()}" if kernel_env() else "")


class SpeedOfLight:
    """The measured limits a sweep scores its trials against, per hardware key.

    The newest doctor run in the tracking store, else (this machine only) a quick set measured once before
    the trials."""

    def __init__(self, tracking_uri: str, known: dict[str, dict[str, float]] | None = None,
                 sources: dict[str, str] | None = None) -> None:
        self._uri = tracking_uri
        self._figures: dict[str, dict[str, float] | None] = dict(known or {})
        self.sources: dict[str, str] = dict(sources or {})  # hardware key -> where its figures came from

    @classmethod
    def for_sweep(cls, tracking_uri: str) -> SpeedOfLight:
        """Look this machine up; measure a quick set (cached) when no doctor run covers it."""
        try:
            key = local_key()
            figures = latest_figures(tracking_uri, key, kernel_env())  # measured under this process's kernels
            source = "doctor run"
            if figures is None:
                figures, source = cached_quick_figures(key), "quick figures (run `sweeps doctor` for the full set)"
        except Exception as exc:  # noqa: BLE001 - scoring is a bonus: the sweep runs without it
            logger.warning("speed of light: no figures for this machine (%s: %s)", type(exc).__name__, exc)
            return cls(tracking_uri)
        return cls(tracking_uri, {key: figures}, {key: source + _emulation_note(figures)})

    def figures(self, key: str) -> dict[str, float] | None:
        if key not in self._figures:  # another node type: only a doctor run can tell
            self._figures[key] = latest_figures(self._uri, key)
            if self._figures[key] is not None:
                self.sources[key] = "doctor run"
        return self._figures[key]

    def emulated_precisions(self) -> frozenset[str]:
        """The mixed precisions any node's figures known so far measured emulated (`emulated`)."""
        return frozenset(p for f in self._figures.values() if f for p in MIXED if emulated(f, p))

    def score_trial(self, metrics: dict[str, Any], params: dict[str, Any]) -> dict[str, float]:
        kind, name = metrics.get("device/type"), metrics.get("device/name")
        if not isinstance(kind, str) or not isinstance(name, str):
            return {}
        figures = self.figures(hardware_key(kind, name))
        return score(metrics, params, figures) if figures else {}
