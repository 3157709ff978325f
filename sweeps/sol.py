"""Speed of light: a trial's figures against what its hardware measured it can do (`sweeps doctor`).

Torch-free at import: `quick_figures` imports the measuring code when called.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

DOCTOR_EXPERIMENT = "sweeps-doctor"
DOCTOR_TAG = "doctor"  # "true" on every doctor run
HARDWARE_TAG = "doctor.hardware_key"  # on the run that carries one hardware type's figures as metrics
SOL_PCT = "perf/sol_pct"
H2D_BW_PCT = "perf/h2d_bw_pct"
INPUT_SOL_PCT = "perf/input_sol_pct"
H2D_GB_PER_S = "copy/h2d_gb_per_s"  # a trial's mean host->device bytes per second of measured time, per rank
DECODE_RATE = "input/decode_samples_per_s_per_core"
DECODE_IMAGE_SIZE = "input/decode_image_size"
_LABELS = {"32": "fp32", "tf32": "tf32", "16-mixed": "fp16", "bf16-mixed": "bf16"}


def hardware_key(device_type: str, device_name: str) -> str:
    """What doctor figures are filed under: the device type and model, e.g. `cuda:NVIDIA H100 80GB HBM3` or
    `cpu:Intel(R) Xeon(R) Processor` (a trial's `device/type` and `device/name` tags give the same)."""
    return f"{device_type}:{device_name}"


def peak_key(precision: str, per_core: bool) -> str:
    return f"matmul/{_LABELS.get(precision, precision)}_tflops_per_s" + ("_per_core" if per_core else "")


def _num(d: dict[str, Any], key: str) -> float | None:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        f = float(v)
    except ValueError:
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def _sol_pct(metrics: dict[str, Any], params: dict[str, Any], figures: dict[str, Any]) -> float | None:
    achieved, precision = _num(metrics, "perf/tflops_per_s"), params.get("precision")
    world = _num(metrics, "progress/world_size")
    if achieved is None or world is None or precision is None:
        return None
    per_core = _num(figures, peak_key(str(precision), per_core=True))
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
    rate, samples, world = _num(figures, DECODE_RATE), _num(metrics, "throughput/samples_per_s"), _num(metrics, "progress/world_size")
    if params.get("workload") != "image-cnn" or rate is None or samples is None or world is None:
        return None
    size = _num(params, "workload.image_size") or 32.0  # image-cnn's default
    if _num(figures, DECODE_IMAGE_SIZE) != size:
        return None  # decode cost grows with the pixels: a rate for other images would mislead
    workers = max(1.0, _num(params, "num_dataloader_workers") or 0.0)
    return 100.0 * samples / (rate * workers * world)


def score(metrics: dict[str, Any], params: dict[str, Any], figures: dict[str, Any]) -> dict[str, float]:
    """A trial's speed-of-light metrics against its hardware's doctor `figures` (`latest_figures` or
    `quick_figures`). Each is absent, never 0, where an input is missing.

    - `perf/sol_pct` = achieved FLOP/s (`perf/tflops_per_s`) / measured peak FLOP/s for the trial's
      `precision`. On a GPU the peak is the per-device matmul figure x `progress/world_size` (one GPU per
      rank). On a CPU the peak is the per-core figure (measured single-threaded) x `progress/world_size` x
      threads per rank (param `cpus_per_worker`, else 1).
    - `perf/h2d_bw_pct` = the trial's `copy/h2d_gb_per_s` (host->device bytes per second of measured time,
      mean per rank; the loop reports it on CUDA only) / the measured h2d bandwidth, pinned or pageable as
      the trial's `pin_memory`.
    - `perf/input_sol_pct` = `throughput/samples_per_s` / (decode+augment samples/s per core x
      max(1, `num_dataloader_workers`) x `progress/world_size`), for `workload` image-cnn only and only when
      the doctor decoded images of the trial's `workload.image_size` (default 32). Meaningful for
      input-bound trials; near 100 means the loader workers are the ceiling.
    """
    out: dict[str, float] = {}
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


def latest_figures(tracking_uri: str, hardware_key: str) -> dict[str, float] | None:
    """The figures (metrics) of the newest doctor run for `hardware_key` in `tracking_uri`, or None
    where the store has none (or cannot be read: scoring is then skipped, not the sweep)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    try:
        exp = client.get_experiment_by_name(DOCTOR_EXPERIMENT)
        if exp is None:
            return None
        key = hardware_key.replace("'", "\\'")
        runs = client.search_runs([exp.experiment_id], f"tags.{DOCTOR_TAG} = 'true' and tags.`{HARDWARE_TAG}` = '{key}'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
    except MlflowException as exc:
        logger.warning("doctor figures unreadable from %s: %s", tracking_uri, exc)
        return None
    return dict(runs[0].data.metrics) if runs else None


def quick_figures() -> dict[str, float]:
    """A few figures measured here and now in <= 5 s on a CPU, for a sweep that finds no doctor run: the
    strict fp32 and bf16 matmul peaks (per core, single-threaded, on a CPU; per device on a GPU) and the
    image decode rate per core. Run `sweeps doctor` for the full set."""
    from trainables.doctor_checks import Device, decode_rate, matmul_peak, precisions, threads

    dev = Device.local()[0]
    cpu = dev.kind == "cpu"
    out: dict[str, float] = {}
    with threads(1 if cpu else None):
        for precision in ("32", "bf16-mixed"):
            if precisions(dev).get(precision) is None:
                flops, _ = matmul_peak(dev, precision, (512,) if cpu else (4096,), 0.6)
                out[peak_key(precision, per_core=cpu)] = flops / 1e12
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


def cached_quick_figures(key: str) -> dict[str, float]:
    """`quick_figures()` for this machine, kept for a week in the user's cache
    ($XDG_CACHE_HOME/gpu-sweeps, else ~/.cache/gpu-sweeps) so each sweep does not pay the 3-5 s again."""
    import hashlib
    import json
    import os
    import time
    from pathlib import Path

    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-sweeps"
    path = root / f"quick-figures-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json"
    try:
        if time.time() - path.stat().st_mtime < QUICK_MAX_AGE_S:
            cached = json.loads(path.read_text())
            if cached.get("hardware_key") == key:
                return {k: float(v) for k, v in cached["figures"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    figures = quick_figures()
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"hardware_key": key, "figures": figures}))
        tmp.replace(path)
    except OSError as exc:  # a read-only home: measured again next time
        logger.warning("could not cache the quick doctor figures in %s: %s", root, exc)
    return figures


class SpeedOfLight:
    """The measured limits a sweep scores its trials against, per hardware key: the newest doctor run
    in the tracking store, else (this machine only) a quick set measured once before the trials."""

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
            figures = latest_figures(tracking_uri, key)
            source = "doctor run"
            if figures is None:
                figures, source = cached_quick_figures(key), "quick figures (run `sweeps doctor` for the full set)"
        except Exception as exc:  # noqa: BLE001 - scoring is a bonus: the sweep runs without it
            logger.warning("speed of light: no figures for this machine (%s: %s)", type(exc).__name__, exc)
            return cls(tracking_uri)
        return cls(tracking_uri, {key: figures}, {key: source})

    def figures(self, key: str) -> dict[str, float] | None:
        if key not in self._figures:  # another node type: only a doctor run can tell
            self._figures[key] = latest_figures(self._uri, key)
            if self._figures[key] is not None:
                self.sources[key] = "doctor run"
        return self._figures[key]

    def score_trial(self, metrics: dict[str, Any], params: dict[str, Any]) -> dict[str, float]:
        kind, name = metrics.get("device/type"), metrics.get("device/name")
        if not isinstance(kind, str) or not isinstance(name, str):
            return {}
        figures = self.figures(hardware_key(kind, name))
        return score(metrics, params, figures) if figures else {}
