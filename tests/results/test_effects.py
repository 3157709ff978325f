"""Each knob's measured effect across the sweep (`sweeps.results.effects`): the fit against hand-made landscapes, and
the verdicts that no longer propose what the sweep measured clearly worse when no exact twin exists."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from sweeps.results.effects import Effects, t_quantile, worse
from sweeps.results.outcome import SweepOutcome, TrialRow
from sweeps.results.report import answer
from sweeps.results.verdict import revise_verdicts, verdict
from sweeps.spec import parse_spec

TPUT = "throughput/samples_per_s"
CASE = """\
name: char-lm
trainable: {name: mlp-tabular}
space:
  num_workers: {type: categorical, choices: [1, 2]}
  batch_size: {type: categorical, choices: [16, 64]}
  precision: {type: categorical, choices: ["32", "bf16-mixed"]}
  params.hidden: {type: categorical, choices: [32, 64]}
budget: {num_trials: 12, num_steps: 10}
"""


def _rows(configs: list[tuple[int, int, str, int]], rate: dict[str, float], seed: int = 0) -> list[TrialRow]:
    """CPU trials as the sweep keeps them: compute-bound fp32 (so their one-trial verdict says "try
    bf16-mixed (this CPU has avx512_bf16)"), throughput = 1000 x each knob's factor x 3% noise."""
    rng = random.Random(seed)
    rows = []
    for i, (workers, batch, precision, hidden) in enumerate(configs, 1):
        tput = 1000.0 * rate[precision] * (1.6 if batch == 64 else 1.0) * (1.8 if workers == 2 else 1.0) \
            * (0.9 if hidden == 64 else 1.0) * rng.uniform(0.97, 1.03)
        params = {"num_workers": workers, "batch_size": batch, "precision": precision, "workload.hidden": hidden,
                  "cpus_per_worker": 1, "cpus_per_loader_worker": 0.0, "compile": False, "use_gpu": False}
        metrics = {TPUT: tput, "throughput/samples_per_s_cv_pct": 2.0, "cpu/worker_util_mean_pct": 97.0,
                   "time/data_wait_pct": 2.0, "device/cpu_isa": "avx2 avx512f avx512_bf16", "device/type": "cpu"}
        rows.append(TrialRow(f"t{i}", i, params, f"run{i}", "ok", "", str(verdict(metrics, params)), metrics))
    return rows


# 8 trials, one per setting of the other three knobs: no fp32 trial has a bf16 twin (every other knob equal)
NO_TWINS = [(w, b, "32" if (w == 1) ^ (b == 16) ^ (h == 32) else "bf16-mixed", h)
            for w, b, h in itertools.product([1, 2], [16, 64], [32, 64])]


def test_no_exact_twin_is_needed_to_refute_a_suggestion() -> None:
    rows = _rows(NO_TWINS, {"32": 1.0, "bf16-mixed": 0.45})
    fp32 = [r for r in rows if r.params["precision"] == "32"]
    assert all("try bf16-mixed (this CPU has avx512_bf16)" in r.verdict for r in fp32)  # what each said alone
    for r in fp32:  # no exact twin: the twin rule cannot fire
        assert not any(o.params["precision"] == "bf16-mixed" and all(o.params[k] == r.params[k] for k in
                       ("num_workers", "batch_size", "workload.hidden")) for o in rows)
    outcome = SweepOutcome(parse_spec(CASE), "p", "sqlite://", rows, 1.0)
    updates = revise_verdicts(outcome)
    for r in fp32:
        assert "bf16-mixed (this CPU" not in r.verdict.split("; try ")[-1], r.verdict
        assert "precision bf16-mixed measured 0.4" in r.verdict and "of precision 32 across the sweep (95% " in r.verdict
        assert r.run_id in updates
    effects = answer(outcome)
    assert "Measured effects across the sweep" in effects and "precision bf16-mixed vs 32: 0.4" in effects


@pytest.mark.parametrize("factor", [0.45, 2.2])
def test_the_fit_recovers_each_knobs_factor_within_its_interval(factor: float) -> None:
    points = list(itertools.product([1, 2], [16, 64], ["32", "bf16-mixed"], [32, 64]))
    rows = _rows(points, {"32": 1.0, "bf16-mixed": factor}, seed=3)
    knobs = ["num_workers", "batch_size", "precision", "workload.hidden"]
    fx = Effects.fit(rows, knobs, TPUT)
    assert fx is not None
    for knob, here, there, truth in (("precision", "32", "bf16-mixed", factor), ("batch_size", 16, 64, 1.6),
                                     ("num_workers", 1, 2, 1.8), ("workload.hidden", 32, 64, 0.9)):
        e = fx.between(knob, here, there)
        assert e is not None and e.low <= truth <= e.high and e.clear, (knob, e)
        assert math.isclose(e.ratio, truth, rel_tol=0.04) and e.n_value == e.n_reference == 8
    said = str(fx.between("precision", "32", "bf16-mixed"))
    assert said.startswith("precision bf16-mixed vs 32: ") and said.endswith("x; 8 vs 8 trials)"), said


def test_no_effect_is_claimed_where_nothing_can_be_separated() -> None:
    rows = _rows(NO_TWINS[:5], {"32": 1.0, "bf16-mixed": 0.45})  # 5 trials, 5 terms
    assert Effects.fit(rows, ["num_workers", "batch_size", "precision", "workload.hidden"], TPUT) is None
    together = _rows([(1, 16, "32", 32), (2, 64, "bf16-mixed", 32)] * 3, {"32": 1.0, "bf16-mixed": 0.45})
    assert Effects.fit(together, ["num_workers", "precision"], TPUT) is None  # always changed together
    flat = _rows(list(itertools.product([1, 2], [16, 64], ["32", "bf16-mixed"], [32])), {"32": 1.0, "bf16-mixed": 1.0})
    e = Effects.fit(flat, ["precision", "batch_size", "num_workers"], TPUT).between("precision", "32", "bf16-mixed")  # type: ignore[union-attr]
    assert e is not None and not e.clear and str(e).endswith("; not clear)")


@pytest.mark.parametrize(("p", "dof", "known"), [(0.975, 40, 2.0211), (0.975, 5, 2.5706), (0.975, 1, 12.7062),
                                                 (0.995, 30, 2.7500), (0.975, 1000, 1.9623), (0.025, 12, -2.1788)])
def test_the_t_quantile_is_exact_at_every_dof(p: float, dof: int, known: float) -> None:
    assert math.isclose(t_quantile(p, dof), known, abs_tol=5e-5)  # the tables' 4 decimals (1.96 was 3% short at 40)


def test_the_interval_is_students_t_past_30_dof() -> None:
    """One knob, 21 trials at each level: the contrast is the difference of the two mean logs, its
    standard error by hand, its 95% interval that error times t(0.975, 40) = 2.0211 (1.96 before)."""
    rng = random.Random(5)
    runs = {lv: [math.exp(rng.gauss(0.1 if lv == "bf16-mixed" else 0.0, 0.05)) for _ in range(21)] for lv in ("32", "bf16-mixed")}
    rows = [TrialRow(f"{lv}{i}", i, {"precision": lv}, status="ok", metrics={TPUT: v})
            for lv, vs in runs.items() for i, v in enumerate(vs)]
    logs = {lv: [math.log(v) for v in vs] for lv, vs in runs.items()}
    spread = sum(sum((y - sum(ys) / 21) ** 2 for y in ys) for ys in logs.values()) / 40
    se = math.sqrt(spread * 2 / 21)
    e = Effects.fit(rows, ["precision"], TPUT).between("precision", "32", "bf16-mixed")  # type: ignore[union-attr]
    assert e is not None and math.isclose(math.log(e.high / e.ratio), 2.0211 * se, rel_tol=1e-4)


def _null_sweep(seed: int, n: int = 48, knobs: int = 10) -> list[TrialRow]:
    """`n` trials at random levels of `knobs` binary knobs that do nothing (k0..k9) and one that does,
    precision bf16-mixed at 0.9x of 32, under 5% log-normal noise."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        params: dict[str, object] = {f"k{j}": rng.choice(["a", "b"]) for j in range(knobs)}
        params["precision"] = rng.choice(["32", "bf16-mixed"])
        tput = 1000.0 * (0.9 if params["precision"] == "bf16-mixed" else 1.0) * math.exp(rng.gauss(0.0, 0.05))
        rows.append(TrialRow(f"t{i}", i, params, status="ok", metrics={TPUT: tput}))
    return rows


def test_many_null_knobs_are_not_called_clearly_worse_by_chance() -> None:
    """10 knobs with no effect and one real, 100 seeded sweeps of 48 trials: each comparison's own 95%
    interval lies below 1 for some null knob in about 1 - 0.975^10 = 22% of them (the verdicts vetoed
    those suggestions before); jointly over the 11 comparisons (Bonferroni) in at most 2.5%. The real
    0.9x is still clearly worse in every sweep."""
    knobs = [f"k{j}" for j in range(10)]
    own, joint, found = 0, 0, 0
    for seed in range(100):
        fx = Effects.fit(_null_sweep(seed), [*knobs, "precision"], TPUT)
        assert fx is not None and fx.family == 11
        nulls = [fx.between(k, "a", "b") for k in knobs]
        own += any(e is not None and e.high < 1.0 for e in nulls)  # the rule before: one comparison's own 95%
        vetoed = [e for e in nulls if e is not None and worse(e, "max")]
        joint += bool(vetoed)
        real = fx.between("precision", "32", "bf16-mixed")
        found += real is not None and worse(real, "max")
        said = [str(e) for e in nulls if e is not None and e.high < 1.0 and not vetoed]
        assert all(s.endswith("; not clear over 11 comparisons)") for s in said), said
    assert own >= 12 and joint <= 4 and found == 100, (own, joint, found)


def test_one_rank_is_never_told_it_waits_for_other_ranks() -> None:
    params = {"num_workers": 1, "batch_size": 16, "precision": "32", "cpus_per_worker": 1, "cpus_per_loader_worker": 1.0}
    v = verdict({"cpu/worker_util_mean_pct": 40.0, "time/data_wait_pct": 5.0}, params)
    assert v.name == "underutilised" and "all-reduce" not in str(v) and "a core another process holds" in str(v)
    two = verdict({"cpu/worker_util_mean_pct": 40.0, "time/data_wait_pct": 5.0}, {**params, "num_workers": 2})
    assert "waiting for the other ranks in the gradient all-reduce" in str(two)
