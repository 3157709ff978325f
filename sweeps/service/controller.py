"""One sweep's run, owned by one object (as Ray Train V2's controller owns its run): `SweepController`
holds the sweep's live state -- its search state (OOM bounds, failures, the breaker, what is left), its
callback, its warm pool, its tracker -- sets them current while the sweep runs (`sweeps.search.live_state.running`,
`sweeps.service.callback.live`: Tune pickles and copies the searcher, stopper and callback, which look
them up), runs Tune, and concludes: the unfinished trials settled, the sweep-level figures and the answer
written, the report published."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

from sweeps.results.money import groups_usd, sweep_total
from sweeps.results.outcome import UNFINISHED, SweepOutcome
from sweeps.results.quality import annotate, log_updates
from sweeps.results.report import rows_from_runs, sweep_note
from sweeps.results.sol import SpeedOfLight
from sweeps.results.verdict import revise_verdicts
from sweeps.search.live_state import SearchState, running
from sweeps.search.searcher import make_scheduler, make_searcher
from sweeps.service.breaker import BreakerStopper
from sweeps.service.callback import SweepCallback, live
from sweeps.service.pool import WarmPool
from sweeps.service.progress import TERMINAL, overhead_line, planned_cost
from sweeps.service.resources import DRIVER_RESOURCES, concurrency_note
from sweeps.service.saved_state import SweepState, experiment_dir, resume_command
from sweeps.service.trial import run_trial
from sweeps.service.waits import PoolStarts, RayCluster, WaitWatcher, free_for_sweep
from sweeps.spec import SweepSpec
from sweeps.tracking import SweepTracker
from trainables.contract import SWEEP_USD

# Tune hands the next trial to the finished trial's actor (same resources: always here) instead of
# starting a new process: ~1 s less per trial on 2 vCPU (benchmarks/sweep_overhead.py). The Train
# controller and workers are still new for every trial.
REUSE_TRIAL_ACTORS = True
# Tune saves its experiment state (trials, searcher) every 10 s or more by default; a driver
# killed in between forgets the trials it started since. Small sweeps' state is tiny: save often.
_STATE_PERIOD_S = "2"


class SweepController:
    """One sweep on a connected Ray cluster: new (`saved` None) or resumed from its saved state."""

    def __init__(self, spec: SweepSpec, spec_text: str, echo: Callable[[str], None], saved: SweepState | None,
                 tracker: SweepTracker) -> None:
        self.spec, self.spec_text, self.echo, self.saved, self.tracker = spec, spec_text, echo, saved, tracker
        self.search = SearchState()
        self.token = saved.token if saved is not None else uuid.uuid4().hex  # names the sweep's actors
        self.exp_dir = experiment_dir(spec)
        self.pool: WarmPool | None = None
        self.waits: WaitWatcher | None = None  # what the sweep waits for while other work holds its resources
        self.parent = saved.parent_run_id if saved is not None else ""
        self.probe_tags: dict[str, str] = {}
        self.probe_s = 0.0
        self.state = saved  # what the sweep keeps on disk (a new sweep's once its parent run exists)
        self.t0 = time.monotonic()

    def run(self) -> SweepOutcome:
        """The sweep, from its warm pool to its report."""
        for key, value in (("TUNE_GLOBAL_CHECKPOINT_S", _STATE_PERIOD_S),
                           # progress reports carry throughput but not validation loss, which only the final report
                           # has: Tune would otherwise refuse the first report of a sweep whose objective is loss/val
                           ("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1"),
                           # Tune's own result files: CSV and JSON (its ResultGrid reads them), not TensorBoard's
                           # (MLflow is the record; importing tensorboardX cost the first trial's result ~1 s here)
                           ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")):
            os.environ.setdefault(key, value)
        # Every rank works here, as under torchrun: the user's relative paths resolve as they do for them
        # (inside `ray job submit`, this is the job's working directory).
        workdir = os.getcwd()
        trials_dir = str(self.exp_dir / "trials")
        if self.spec.scaling.reuse_workers:
            self.pool = WarmPool(self.spec, trials_dir, self.token, workdir)
        self.waits = WaitWatcher(self.spec, self.echo, RayCluster(),
                                 PoolStarts(self.pool.queue) if self.pool is not None else None).start()
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, spec=self.spec, storage_path=trials_dir,
                                 pool=self.pool.queue if self.pool is not None else None, workdir=workdir),
            DRIVER_RESOURCES)
        with running(self.search):
            callback = self._callback()
            with live(callback):
                tuner = self._tuner(trainable, callback)
                callback.speed_of_light = SpeedOfLight.for_sweep(self.tracker.uri)  # before the trials: it competes with none
                for key, source in callback.speed_of_light.sources.items():
                    self.echo(f"speed of light for {key}: {source}")
                if self.saved is None:  # a new sweep: what it will cost, with a warm group's start measured here
                    self.echo(planned_cost(self.spec, self._first_group_s()))
                self._keep(began=time.time(), held_usd=None)  # this driver's run, in the sweep's ledger of what it held
                return self._fit(tuner, callback)

    def _callback(self) -> SweepCallback:
        """The sweep's callback, with the rows of a resumed sweep's trials (its parent run reattached)."""
        if self.saved is None:
            return SweepCallback(self.spec, self.tracker, self.echo, self.search)
        rows = rows_from_runs(self.tracker.resume_sweep(self.parent))
        done = sum(r.status not in UNFINISHED for r in rows)
        self.echo(f"resuming sweep {self.spec.name} from {self.exp_dir}: {done} of {self.spec.budget.num_trials} trials "
                  f"already ended; MLflow parent run {self.parent}")
        return SweepCallback(self.spec, self.tracker, self.echo, self.search, rows)

    def _tuner(self, trainable: Any, callback: SweepCallback) -> tune.Tuner:
        """Tune's tuner: restored (the same parent and child runs, the searcher's state, finished trials), or
        new with the sweep's parent run, searcher, scheduler, stopper and callback."""
        callback.queue = self.pool.queue if self.pool is not None else None
        callback.waits = self.waits
        callback.trials_dir = str(self.exp_dir / "trials")
        spec = self.spec
        if self.saved is not None:
            return tune.Tuner.restore(str(self.exp_dir), trainable=trainable, resume_unfinished=True,
                                      resume_errored=False)
        cluster = ray.cluster_resources()
        resources = {k: str(v) for k, v in cluster.items() if k in ("CPU", "GPU", "memory")}
        self.parent = self.tracker.start_sweep(
            spec.name, spec.description, self.spec_text,
            tags={f"sweep.cluster.{k}": v for k, v in resources.items()} | {"sweep.objective": spec.objective.describe()})
        prices = spec.cost.saved() if spec.cost is not None and spec.cost.price_file is not None else None
        self.state = SweepState(self.spec_text, self.token, self.parent, self.tracker.uri, prices=prices)
        self.state.write(self.exp_dir)
        if prices is not None:  # beside the spec: `sweeps report` reads them back from any directory
            self.tracker.client.log_dict(self.parent, prices, "prices.json")
        self.echo(concurrency_note(spec, cluster, free_for_sweep(self.waits.cluster) if self.waits is not None else None))
        self.echo(f"sweep {spec.name}: {spec.budget.num_trials} trials, objective {spec.objective.describe()}; "
                  f"MLflow parent run {self.parent} at {self.tracker.uri}")
        return tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(search_alg=make_searcher(spec), scheduler=make_scheduler(spec),
                                        num_samples=spec.budget.num_trials,
                                        max_concurrent_trials=spec.budget.max_concurrent_trials,
                                        time_budget_s=spec.budget.time_budget_s, reuse_actors=REUSE_TRIAL_ACTORS),
            run_config=tune.RunConfig(name=spec.name, storage_path=str(self.exp_dir.parent), verbose=0,
                                      callbacks=[callback, CSVLoggerCallback(), JsonLoggerCallback()],
                                      stop=BreakerStopper()),
        )

    def _fit(self, tuner: tune.Tuner, callback: SweepCallback) -> SweepOutcome:
        """The memory probe, then Tune's run; whatever happens, the conclusion and the overhead line."""
        ok = hurried = False
        try:
            waited_out = self.waits is not None and self.waits.over  # budget.max_queue_s: Tune's first step halts
            if self.pool is not None and self.spec.search.probe_batch_size and not waited_out:  # before the search
                from sweeps.service.probe import probe_frontier

                probe_t0 = time.monotonic()
                self.probe_tags = probe_frontier(self.spec, self.pool.queue, self.search, self.echo)
                self.probe_s = time.monotonic() - probe_t0
            tuner.fit()
            ok = True
        except KeyboardInterrupt:  # a second signal: stop at once (the trials' state is kept, no figures drawn)
            hurried = True
            raise
        finally:
            wall = time.monotonic() - self.t0
            groups = None
            waited = self.waits.stop() if self.waits is not None else 0.0
            try:
                for trial_id in callback.unfinished():  # an interrupted attempt held its devices too
                    callback.charge(trial_id)
                if self.pool is not None:  # waited for: what its groups held is priced to their end
                    stopped = hurried or (self.waits is not None and bool(self.waits.over))  # halted for its wait: stop groups sooner
                    groups = self.pool.join(timeout_s=10.0 if stopped else 30.0)
                outcome = self._conclude(callback, ok, wall, report=not hurried)
            finally:
                this_run = [r for r in callback.rows.values() if r.trial_id in callback.started()]
                if not hurried:  # its groups were not waited for: no count to give
                    self.echo(overhead_line(this_run, wall, groups, self.probe_s, waited))
                TERMINAL.close()  # the live status line gives way to the final output
        return outcome

    def _held_usd(self, callback: SweepCallback) -> tuple[float, str]:
        """What the sweep held at its prices, across its drivers (`money.sweep_total`): this driver's warm
        groups from start to end (its trials and probe ran inside them), or without a pool its trials; kept in
        the sweep's ledger so that a resumed sweep adds to it."""
        whole = True
        if self.pool is not None:
            this_run = groups_usd(self.spec, self.pool.lives)
            whole = all(ended for _, _, ended in self.pool.lives)
        else:
            this_run = sum(callback.charged.values())
        drivers = self.state.drivers if self.state is not None else []
        self._keep(held_usd=this_run)
        return sweep_total([d.get("held_usd") for d in drivers[:-1]], this_run, whole)

    def _keep(self, **entry: Any) -> None:
        """This driver's entry in the sweep's ledger (`SweepState.drivers`): opened when it starts (so a
        driver killed outright leaves an entry that never says what it held), filled when it concludes."""
        if self.state is None:
            return
        if "began" in entry:
            self.state.drivers.append(entry)
        elif self.state.drivers:
            self.state.drivers[-1].update(entry)
        try:
            self.state.write(self.exp_dir)
        except OSError as exc:  # the figures still stand; a resume would count this driver's cost as unknown
            self.echo(f"WARNING: could not save what this run held in {self.exp_dir} ({exc.strerror or exc})")

    def _first_group_s(self, timeout_s: float = 120.0) -> float | None:
        """What the pool's first warm group took to start, less what it waited for resources other work held
        (waiting for it, at most `timeout_s` beyond such a wait, and no longer than budget.max_queue_s allows);
        None without a pool or in time."""
        if self.pool is None:
            return None
        t0 = time.monotonic()
        while not (self.waits is not None and self.waits.over):
            starts = ray.get(self.pool.queue.wait_started.remote(2.0))
            if starts:
                return float(starts[0][1])
            if time.monotonic() - t0 > timeout_s + (self.waits.waited_s if self.waits is not None else 0.0):
                break
        return None

    def _conclude(self, callback: SweepCallback, ok: bool, wall: float, report: bool = True) -> SweepOutcome:
        """The trials are over (or the sweep was stopped): settle the unfinished ones, write the sweep-level
        figures and the parent run's answer to MLflow, and publish the report."""
        spec, tracker, echo, s = self.spec, self.tracker, self.echo, self.search
        # Tune stopped early (a halt, Ctrl+C) and kept its unfinished trials for resume; or it failed.
        interrupted = "" if ok and not callback.unfinished() else (
            f"halted: {callback.halted}" if callback.halted else "the sweep was interrupted before it finished")
        for row in callback.rows.values():
            if row.status not in UNFINISHED:
                continue
            if interrupted:
                row.status, row.reason = "interrupted", row.reason or interrupted
            else:  # Tune never recorded it (the driver died between starting it and saving its state)
                row.status, row.reason = "lost", "the sweep driver died before Tune recorded this trial; another ran in its place"
            tracker.end_trial(row.trial_id, False, row.status, row.reason, {})
        outcome = SweepOutcome(spec, self.parent, tracker.uri, sorted(callback.rows.values(), key=lambda r: r.number),
                               wall, s.tripped, interrupted, s.exhausted if not interrupted else "")
        self._close_parent(outcome, callback)
        if interrupted:
            echo(f"the sweep did not finish ({interrupted}); continue it with: {resume_command(spec)}")
        if outcome.trials and not tracker.pending and report:
            self._publish_report(outcome)
        return outcome

    def _close_parent(self, outcome: SweepOutcome, callback: SweepCallback) -> None:
        """The sweep-level figures on the trials' runs (quality, revised verdicts), then the parent run's
        metrics, tags and answer; what MLflow did not take is said, never silently dropped."""
        spec, tracker, echo = self.spec, self.tracker, self.echo
        quality_note, quality_updates = annotate(outcome)  # guardrail and predicted time to target: across trials
        for run_id, tags in revise_verdicts(outcome).items():  # next steps another trial measured worse: cited
            metrics, logged = quality_updates.get(run_id, ({}, {}))
            quality_updates[run_id] = (metrics, {**logged, **tags})
        best = outcome.best
        metrics = {spec.objective.primary: float(best.metrics[spec.objective.primary])} if best else {}
        tags = {"sweep.trials_ok": str(len(outcome.ranked())), "sweep.trials_total": str(len(outcome.trials)),
                **self.probe_tags, "sweep.quality_guardrail": quality_note}
        if spec.cost is not None:
            outcome.sweep_usd, outcome.sweep_usd_short = self._held_usd(callback)
            metrics[SWEEP_USD] = outcome.sweep_usd
            tags["sweep.prices"] = "; ".join(f"{k}: ${p.usd_per_hour:g}/h, {p.date}, {p.source}"
                                             for k, p in spec.cost.prices.items())[:5000]
            if outcome.sweep_usd_short:
                tags["sweep.cost_at_least"] = outcome.sweep_usd_short[:5000]
        for key, said in (("sweep.stopped", outcome.stopped_reason), ("sweep.interrupted", outcome.interrupted),
                          ("sweep.exhausted", outcome.exhausted)):
            if said:
                tags[key] = said[:5000]
        if best is not None and best.run_id:
            tags["sweep.best_run_id"] = best.run_id
        if quality_updates and not tracker.pending:
            try:
                log_updates(tracker.client, quality_updates)
            except Exception as exc:  # noqa: BLE001 - the trials are done; say what was not recorded
                echo(f"WARNING: could not log the sweep-level figures (quality, revised verdicts) to MLflow "
                     f"({type(exc).__name__}: {exc})")
        if not tracker.flush():
            path = tracker.dump_pending()
            echo(f"WARNING: MLflow stayed unreachable ({tracker.degraded_reason}); {len(tracker.pending)} tracking "
                 f"calls were not logged and are saved in {path}")
            tags["sweep.tracking"] = f"degraded: {len(tracker.pending)} calls saved in {path}"
        try:
            tracker.end_sweep("KILLED" if outcome.interrupted else "FINISHED", metrics, tags)
            tracker.set_note(sweep_note(outcome))  # the run's description in the UI: the answer, in words
        except Exception as exc:  # noqa: BLE001 - the trials are done; say what was not recorded
            echo(f"WARNING: could not close the MLflow parent run ({type(exc).__name__}: {exc})")

    def _publish_report(self, outcome: SweepOutcome) -> None:
        from sweeps.results.plots import publish

        try:
            publish(outcome, self.tracker.client)
            self.echo(f"report: figures and summary.html logged under report/ on parent run {outcome.parent_run_id}")
        except Exception as exc:  # noqa: BLE001 - figures are secondary; the runs are already logged
            self.echo(f"WARNING: could not draw the report figures ({type(exc).__name__}: {exc}); the runs are complete")
