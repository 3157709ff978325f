"""One sweep's run, owned by one object, as Ray Train V2's controller owns its run.

`SweepController` holds the sweep's live state -- its search state (OOM bounds, failures, the breaker, what is left), its trials' rows,
when each began and ended and what it cost, why the sweep halts -- and ends each trial: priced, scored,
recorded, announced. It sets its state current while the sweep runs (`sweeps.search.live_state.running`,
`sweeps.service.callback.live`: Tune pickles and copies the searcher, stopper and callback, which look them
up), runs Tune, and concludes: the unfinished trials settled, the sweep-level figures and the answer written,
the report published.

Its collaborators come at construction: the tracker, the echo, Ray and Tune (`sweeps.service.tuning.RayTune`:
the warm pool and its queue, the wait watcher, the tuner), the speed of light and the clock; Tune's hooks
reach it through `sweeps.service.callback.SweepCallback`. Given fakes, it runs without a Ray cluster
(tests/service/test_controller.py)."""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from sweeps.results.contention import CONTENDED_TAG, contended
from sweeps.results.money import groups_usd, sweep_total, trial_usd
from sweeps.results.outcome import MEASURED, REPLICATE_TAG, UNFINISHED, SweepOutcome, TrialRow, end_status, probed_from
from sweeps.results.quality import annotate, log_updates
from sweeps.results.report import rows_from_runs, sweep_note
from sweeps.results.sol import SpeedOfLight
from sweeps.results.verdict import revise_verdicts, verdict
from sweeps.search.live_state import SearchState, oom_label, running
from sweeps.search.plan import SIZE, size_changes
from sweeps.search.searcher import knobs_of
from sweeps.search.trials import fixed_knobs, resolve_trial, trial_params
from sweeps.service.breaker import FailureStreak
from sweeps.service.callback import SweepCallback, live
from sweeps.service.failures import failure_of
from sweeps.service.progress import TERMINAL, Costs, TrialCost, conditions, overhead_line, planned_cost, progress_line
from sweeps.service.resources import concurrency_note
from sweeps.service.saved_state import SweepState, analysis_quiet, experiment_dir, resume_command, storage
from sweeps.service.trial import HALT_KEY
from sweeps.service.tuning import RayTune, interrupt_tune
from sweeps.spec import SweepSpec
from sweeps.tracking import SweepTracker
from trainables.contract import DEVICE_PREFIX, PROGRESS_PREFIX, STEPS, SWEEP_USD, TRIAL_USD
from trainables.storage_lease import Lease


class Clock(Protocol):
    """Wall time (compared with the warm pool's, on the same node) and monotonic time: the `time` module."""

    def time(self) -> float: ...
    def monotonic(self) -> float: ...


class SweepController:
    """One sweep on a connected Ray cluster: new (`saved` None) or resumed from its saved state."""

    def __init__(self, spec: SweepSpec, spec_text: str, echo: Callable[[str], None], saved: SweepState | None,
                 tracker: SweepTracker, *, tune: RayTune | None = None,
                 speed_of_light: Callable[[str], SpeedOfLight] = SpeedOfLight.for_sweep, clock: Clock = time,
                 lease: Lease | None = None) -> None:
        self.spec, self.spec_text, self.echo, self.saved, self.tracker = spec, spec_text, echo, saved, tracker
        self.search = SearchState()
        self.token = saved.token if saved is not None else uuid.uuid4().hex  # names the sweep's actors
        self.exp_dir = experiment_dir(spec)  # in the sweep's storage: a local folder or a URI
        self.trials = self.exp_dir.child("trials")  # each trial's checkpoints and its ranks' traces
        self.lease = lease  # the sweep's lock on a URI (`sweep_lock`): lost, the sweep halts
        self.tune = tune if tune is not None else RayTune(spec, storage(spec), self.token)
        self.measure, self.clock = speed_of_light, clock
        self.callback = SweepCallback(self)  # what Tune calls (pickled as a reference to this one: `live`)
        self.parent = saved.parent_run_id if saved is not None else ""
        self.probe_tags: dict[str, str] = {}
        self.probe_s = 0.0
        self.state = saved  # what the sweep keeps on disk (a new sweep's once its parent run exists)
        self.t0 = self.trials_t0 = clock.monotonic()  # the sweep's wall time; the trials' (`run`)
        # The trials' live state
        self.rows: dict[str, TrialRow] = {}  # every trial of the sweep (a resumed sweep's earlier ones too)
        self.streak = FailureStreak(spec.budget.max_identical_failures)
        self._started: set[str] = set()  # by this driver; Tune ends each one unless it stops early
        self._ended: set[str] = set()
        self.began: dict[str, float] = {}  # wall time each trial started (this driver)
        self.cost: dict[str, float] = {}  # each ended trial's own wall time, start to end: what the ETA uses (`Costs`)
        self.prior_usd: dict[str, float] = {}  # what a trial run again (after a resume) cost in its earlier attempts
        self.charged: dict[str, float] = {}  # what each trial this driver ran cost in it (`charge`)
        self.halted = ""  # why the sweep halts: a trial's HALT_KINDS, or a wait over budget.max_queue_s
        self.speed_of_light: SpeedOfLight | None = None  # measured limits to score finished trials against

    def run(self) -> SweepOutcome:
        """The sweep, from its warm pool to its report."""
        self.tune.start(self.echo)
        with running(self.search), live(self):
            if self.saved is not None:
                self.resume(rows_from_runs(self.tracker.resume_sweep(self.parent)))
            self.trials_t0 = self.clock.monotonic()  # what the progress lines' elapsed and time_budget_s count from
            tuner = self._tuner()
            self.speed_of_light = self.measure(self.tracker.uri)  # before the trials: it competes with none
            for key, source in self.speed_of_light.sources.items():
                self.echo(f"speed of light for {key}: {source}")
            if self.saved is None:  # a new sweep: what it will cost, with a warm group's start measured here
                self.echo(planned_cost(self.spec, self.tune.first_group_s()))
            self._keep(began=self.clock.time(), held_usd=None)  # this driver's run, in the sweep's ledger of what it held
            return self._fit(tuner)

    def resume(self, rows: list[TrialRow]) -> None:
        """A resumed sweep's trials (its parent run reattached): their rows, and what they learnt about memory."""
        self.rows = {r.trial_id: r for r in rows}
        for row in rows:
            if row.status == "oom":
                self.search.record_oom(knobs_of(self.spec, row))
        done = sum(r.status not in UNFINISHED for r in rows)
        self.echo(f"resuming sweep {self.spec.name} from {self.exp_dir}: {done} of {self.spec.budget.num_trials} trials "
                  f"already ended; MLflow parent run {self.parent}")

    def _tuner(self) -> Any:
        """Tune's tuner: restored (the same parent and child runs, the searcher's state, finished trials), or
        new with the sweep's parent run, searcher, scheduler, stopper and callback."""
        spec = self.spec
        if self.saved is not None:
            return self.tune.tuner(self.callback, restore=True)
        cluster = self.tune.cluster()
        resources = {k: str(v) for k, v in cluster.items() if k in ("CPU", "GPU", "memory")}
        self.parent = self.tracker.start_sweep(
            spec.name, spec.description, self.spec_text,
            tags={f"sweep.cluster.{k}": v for k, v in resources.items()} | {"sweep.objective": spec.objective.describe()})
        prices = spec.cost.saved() if spec.cost is not None and spec.cost.price_file is not None else None
        self.state = SweepState(self.spec_text, self.token, self.parent, self.tracker.uri, prices=prices)
        self.state.write(self.exp_dir)
        if prices is not None:  # beside the spec: `sweeps report` reads them back from any directory
            self.tracker.client.log_dict(self.parent, prices, "prices.json")
        self.echo(concurrency_note(spec, cluster, self.tune.free()))
        self.echo(f"sweep {spec.name}: {spec.budget.num_trials} trials, objective {spec.objective.describe()}; "
                  f"MLflow parent run {self.parent} at {self.tracker.uri}")
        return self.tune.tuner(self.callback, restore=False)

    def _fit(self, tuner: Any) -> SweepOutcome:
        """The memory probe, then Tune's run; whatever happens, the conclusion and the overhead line."""
        ok = hurried = False
        waits = self.tune.waits
        try:
            probe_t0 = self.clock.monotonic()
            tags = self.tune.probe(self.search, self.echo)  # before the search
            if tags is not None:
                self.probe_tags, self.probe_s = tags, self.clock.monotonic() - probe_t0
            with analysis_quiet():  # Tune's analysis at the end looks for result files a URI does not get
                tuner.fit()
            ok = True
        except KeyboardInterrupt:  # a second signal: stop at once (the trials' state is kept, no figures drawn)
            hurried = True
            raise
        finally:
            wall = self.clock.monotonic() - self.t0
            waited = waits.stop() if waits is not None else 0.0
            groups = None
            try:
                for trial_id in self.unfinished():  # an interrupted attempt held its devices too
                    self.charge(trial_id)
                # waited for: what its groups held is priced to their end (halted for its wait: stopped sooner)
                groups = self.tune.join(stopped=hurried or (waits is not None and bool(waits.over)))
                outcome = self._conclude(ok, wall, report=not hurried)
            finally:
                this_run = [r for r in self.rows.values() if r.trial_id in self._started]
                if not hurried:  # its groups were not waited for: no count to give
                    self.echo(overhead_line(this_run, wall, groups, self.probe_s, waited))
                TERMINAL.close()  # the live status line gives way to the final output
        return outcome

    # Tune's hooks (`SweepCallback`)

    def trial_started(self, trial_id: str, config: dict[str, Any]) -> None:
        params = trial_params(self.spec, resolve_trial(self.spec, config))
        row = self.rows.get(trial_id)
        if row is None:
            row = TrialRow(trial_id, max((r.number for r in self.rows.values()), default=0) + 1, params)
            self.rows[trial_id] = row
        row.status, row.reason = "running", ""  # a resumed trial starts over in the same MLflow run
        prior = row.metrics.get(TRIAL_USD)
        if isinstance(prior, (int, float)):  # its interrupted attempt cost money too: its cost adds up
            self.prior_usd[trial_id] = float(prior)
        self._started.add(trial_id)
        self.began[trial_id] = self.clock.time()  # wall clock: compared with the queue's (same node)
        self.tracker.start_trial(trial_id, row.number, params)
        row.run_id = self.tracker.run_id(trial_id)
        shown = ", ".join(f"{k}={v}" for k, v in config.items())
        first = self.search.replicate_of.get(trial_id)
        if first in self.rows:
            row.replicate_of = self.rows[first].number
        again = f" (a replicate of trial {row.replicate_of})" if row.replicate_of else ""
        self.echo(f"[trial {row.number}/{self.spec.budget.num_trials}] {trial_id} started{again}: {shown}")

    def trial_reported(self, trial_id: str, result: dict[str, Any], iteration: int) -> None:
        row = self.rows[trial_id]
        if result.get(HALT_KEY):
            row.reason = str(result[HALT_KEY])
            self.halt(f"trial {row.number} {row.reason}")
            return
        row.metrics.update({k: v for k, v in result.items() if "/" in k})
        self.tracker.log_result(trial_id, result, step=int(result.get(STEPS, iteration)))

    def trial_completed(self, trial_id: str) -> None:
        row = self.rows[trial_id]
        status, reason, missing = end_status(self.spec, row.metrics, self.search.tripped, self._out_of_time())
        if missing:
            self._unranked(row, missing)
        else:
            self._end_trial(trial_id, status, reason)

    def trial_errored(self, trial_id: str, error: BaseException | None) -> None:
        kind, reason = failure_of(error)
        self.search.failures[trial_id] = kind  # the searcher learns from it (infeasible or not)
        self._end_trial(trial_id, kind, reason)

    def step_ended(self) -> None:
        # budget.max_queue_s: once trials are out (a halt before any would end the sweep as if finished)
        over = getattr(self.tune.waits, "over", "")
        if over and self.unfinished():
            self.halt(over)
        if self.lease is not None and self.lease.lost:  # another driver may run the sweep now: stop, resumable
            self.halt(f"the sweep's lock was lost ({self.lease.lost})")

    def halt(self, why: str) -> None:
        """Stop the sweep, resumable: the trials still running run again when it is resumed."""
        if self.halted:
            return
        self.halted = why
        self.echo(f"HALTING the sweep: {why}. Finished trials are kept; trials still running "
                  "run again when the sweep is resumed.")
        if not interrupt_tune():  # not Tune's main thread: stop every trial instead (they end as stopped)
            self.search.tripped = f"halted: {self.halted}"

    def started(self) -> set[str]:
        """Trials this driver started (a resumed sweep's earlier trials are not among them)."""
        return set(self._started)

    def unfinished(self) -> set[str]:
        """Trials this driver started that Tune never ended: it stopped early (a halt, Ctrl+C)."""
        return self._started - self._ended

    def _unranked(self, row: TrialRow, missing: list[str]) -> None:
        """A finished trial without the objective's metrics cannot be ranked, and the next trials of
        the same trainable will not report them either: stop the sweep now and say what is there."""
        reported = sorted(k for k, v in row.metrics.items() if "/" in k and not k.startswith((PROGRESS_PREFIX, DEVICE_PREFIX))
                          and isinstance(v, (int, float)))
        reason = (f"the trial reported no {', '.join(missing)}, so no trial can be ranked; it reported: "
                  f"{', '.join(reported)}. Name one of those in objective (metric or constraints), or make the "
                  "trainable report it (eval_fn for eval/<name>)")
        self._end_trial(row.trial_id, "config", reason)
        if not self.search.tripped:
            self.search.tripped = f"objective metric not reported: {reason}"
            self.echo(f"STOPPING the sweep: {reason}")

    def _out_of_time(self) -> bool:
        limit = self.spec.budget.time_budget_s
        return limit is not None and self.clock.monotonic() - self.trials_t0 >= limit * 0.95

    # The end of a trial

    def _end_trial(self, trial_id: str, status: str, reason: str) -> None:
        """Tune ended the trial: its cost, its scores, its MLflow run closed, the lines that say so."""
        self._ended.add(trial_id)
        row = self.rows[trial_id]
        self._price(trial_id)
        row.status, row.reason = status, reason
        tags = self._score(row)
        knobs = self._record(row, tags)
        self._announce(row, knobs)

    def _price(self, trial_id: str) -> None:
        self.charge(trial_id)
        if self.tune.queue is not None:  # Tune ended it: a warm group still running (or queueing) it stops
            self.tune.queue.cancel(trial_id)

    def charge(self, trial_id: str) -> None:
        """Price what the trial held into `cost/trial_usd` (a failed trial costs money too).

        That is from its start in this driver to its end (or now, for one interrupted), at its price, added to
        what its earlier attempts cost."""
        if trial_id not in self.began:
            return
        row = self.rows[trial_id]
        began, ended = self._pool_span(trial_id)
        self.cost[trial_id] = (ended or self.clock.time()) - max(self.began[trial_id], began or 0.0)
        spent = trial_usd(self.spec, row.params, self.cost[trial_id])
        if spent:
            self.charged[trial_id] = spent[TRIAL_USD]
            spent[TRIAL_USD] += self.prior_usd.get(trial_id, 0.0)
            row.metrics.update(spent)
            self.tracker.log_result(trial_id, spent, step=int(row.metrics.get(STEPS, 0)))

    def _pool_span(self, trial_id: str) -> tuple[float | None, float | None]:
        """When a warm group's trial began and ended costing (`Queue.span`; nothing without a pool): the
        first trial's Tune actor and group start-up, and a final report's way on to this driver, are the
        sweep's, so the ETA leaves them out."""
        if self.tune.queue is None:
            return None, None
        try:
            return self.tune.queue.span(trial_id)
        except Exception:  # noqa: BLE001 - only the ETA depends on it
            return None, None

    def _score(self, row: TrialRow) -> dict[str, str]:
        """A measured trial against this hardware's speed of light, its verdict, and whether other work shared
        its node or GPUs; the tags its run is closed with."""
        tags = {REPLICATE_TAG: str(row.replicate_of)} if row.replicate_of else {}
        if row.status not in MEASURED:
            return tags
        sol = self.speed_of_light.score_trial(row.metrics, row.params) if self.speed_of_light else {}
        if sol:  # against this hardware's measured peaks: logged like the trial's own metrics
            row.metrics.update(sol)
            self.tracker.log_result(row.trial_id, sol, step=int(row.metrics.get(STEPS, 0)))
        v = verdict(row.metrics, row.params)
        row.verdict = str(v)
        tags |= {"sweep.verdict": v.name, "sweep.verdict_reason": v.reason}
        shared = contended(row.metrics)
        if shared:  # measured while other work used its node or GPUs: said on its run, in its verdict
            tags[CONTENDED_TAG] = shared
        return tags

    def _record(self, row: TrialRow, tags: dict[str, str]) -> dict[str, Any]:
        """Its ranks' traces and its end on its MLflow run; an OOM's bound on the search (its knobs, returned)."""
        traces = f"{self.spec.name}-{row.trial_id}/traces"  # each rank's trace of its last warm-up steps (trainables.trace)
        try:
            if self.trials.exists(traces):  # in the storage, from whatever node each rank ran on
                self.tracker.log_files(row.trial_id, self.trials.child(traces), "trace")
        except OSError as exc:  # the storage did not answer (a StorageError): the trial's figures still stand
            self.echo(f"WARNING: could not look for trial {row.number}'s traces ({exc})")
        self.tracker.end_trial(row.trial_id, row.status in (*MEASURED, "pruned"), row.status, row.reason, tags)
        row.run_id = row.run_id or self.tracker.run_id(row.trial_id)
        knobs = knobs_of(self.spec, row) if row.status == "oom" else {}
        if knobs:  # before the progress line: the grid points it rules out are no longer to come
            self.search.record_oom(knobs)
        return knobs

    def _announce(self, row: TrialRow, oom_knobs: dict[str, Any]) -> None:
        """The progress line; the circuit breaker (the same error N times in a row will not fix itself, e.g. an
        ImportError); what an OOM rules out."""
        self.echo(self._progress(row))
        why = self.streak.add(row.status, row.reason)
        if why and not self.search.tripped:
            self.search.tripped = why
            self.echo(f"STOPPING the sweep: {why}. Fix that, then run the sweep again.")
        if oom_knobs:
            self.echo(f"out of memory at batch_size={oom_knobs['batch_size']} with {oom_label(oom_knobs)}: "
                      "no batch this large or larger will be tried with those settings")

    def _progress(self, row: TrialRow) -> str:
        now = self.clock.time()
        ended = [TrialCost.of(self._precision(k), cost, self.rows[k].metrics) for k, cost in self.cost.items()]
        running = [(self._precision(k), now - t) for k, t in self.began.items() if k not in self._ended]
        slow = self.speed_of_light.emulated_precisions() \
            if self.speed_of_light is not None and not self.spec.scaling.use_gpu else frozenset()
        skipped = [str(k.get("precision")) for k in self.search.grid_skips(fixed_knobs(self.spec))]
        group_s, restarts = self._restarts()
        # the conditions now: what the running trials' latest reports measured (None where none did yet)
        shared = [c for k in self.began if k not in self._ended if (c := conditions(self.rows[k].metrics)) is not None]
        return progress_line(self.spec, row, list(self.rows.values()), self.clock.monotonic() - self.trials_t0,
                             Costs(ended, running, slow, skipped, group_s, restarts, self.search.space_left,
                                   any(shared) if shared else None))

    def _restarts(self) -> tuple[float, float]:
        """(what a warm group's start cost on this cluster, the restarts the trials to come are expected to
        need): a restart's measured start where one was made, else the first group's."""
        if self.tune.queue is None:
            return 0.0, 0.0
        try:
            starts = self.tune.queue.group_starts()
        except Exception:  # noqa: BLE001 - only the ETA depends on it
            return 0.0, 0.0
        took = [s for _, s, why in starts if why != "first"] or [s for _, s, _ in starts]
        if not took:
            return 0.0, 0.0
        n = max(0, self.spec.budget.num_trials - len(self.rows))
        state = self.search
        if state.runs is not None:
            return statistics.fmean(took), state.runs.expected_restarts(n)
        latest = max(self.rows.values(), key=lambda r: r.number, default=None)
        current = int(latest.params["num_workers"]) if latest is not None and "num_workers" in latest.params else None
        sizes = [int(p[SIZE]) for p in state.grid_left if SIZE in p][:n]
        return statistics.fmean(took), float(size_changes(current, sizes))

    def _precision(self, trial_id: str) -> str:
        return str(self.rows[trial_id].params.get("precision"))

    # The end of the sweep

    def _held_usd(self) -> tuple[float, str]:
        """What the sweep held at its prices, across its drivers (`money.sweep_total`): this driver's warm
        groups from start to end (its trials and probe ran inside them), or without a pool its trials; kept in
        the sweep's ledger so that a resumed sweep adds to it."""
        whole = True
        if self.tune.queue is not None:
            this_run = groups_usd(self.spec, self.tune.lives)
            whole = all(ended for _, _, ended in self.tune.lives)
        else:
            this_run = sum(self.charged.values())
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

    def _conclude(self, ok: bool, wall: float, report: bool = True) -> SweepOutcome:
        """The trials are over (or the sweep was stopped): settle the unfinished ones, write the sweep-level
        figures and the parent run's answer to MLflow, and publish the report."""
        spec, tracker, echo, s = self.spec, self.tracker, self.echo, self.search
        # Tune stopped early (a halt, Ctrl+C) and kept its unfinished trials for resume; or it failed.
        interrupted = "" if ok and not self.unfinished() else (
            f"halted: {self.halted}" if self.halted else "the sweep was interrupted before it finished")
        for row in self.rows.values():
            if row.status not in UNFINISHED:
                continue
            if interrupted:
                row.status, row.reason = "interrupted", row.reason or interrupted
            else:  # Tune never recorded it (the driver died between starting it and saving its state)
                row.status, row.reason = "lost", "the sweep driver died before Tune recorded this trial; another ran in its place"
            tracker.end_trial(row.trial_id, False, row.status, row.reason, {})
        outcome = SweepOutcome(spec, self.parent, tracker.uri, sorted(self.rows.values(), key=lambda r: r.number),
                               wall, s.tripped, interrupted, s.exhausted if not interrupted else "",
                               probed=probed_from(self.probe_tags))
        self._close_parent(outcome)
        if interrupted:
            echo(f"the sweep did not finish ({interrupted}); continue it with: {resume_command(spec)}")
        if outcome.trials and not tracker.pending and report:
            self._publish_report(outcome)
        return outcome

    def _close_parent(self, outcome: SweepOutcome) -> None:
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
            outcome.sweep_usd, outcome.sweep_usd_short = self._held_usd()
            metrics[SWEEP_USD] = outcome.sweep_usd
            tags["sweep.prices"] = "; ".join(f"{k}: ${p.usd_per_hour:g}/h, {p.date}, {p.source}"
                                             for k, p in spec.cost.prices.items())[:5000]
            if outcome.sweep_usd_short:
                tags["sweep.cost_at_least"] = outcome.sweep_usd_short[:5000]
        # how the sweep ended, as this driver concludes it: what an earlier driver said of it is replaced
        ends = {"sweep.stopped": outcome.stopped_reason, "sweep.interrupted": outcome.interrupted,
                "sweep.exhausted": outcome.exhausted}
        tags.update({key: said[:5000] for key, said in ends.items() if said})
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
            # KILLED: resumable; FAILED: it ended and no trial finished (a rerun leaves it alone, as a FINISHED one)
            tracker.end_sweep("KILLED" if outcome.interrupted else "FINISHED" if outcome.best else "FAILED", metrics, tags,
                              unsaid=tuple(key for key, said in ends.items() if not said))
            # the run's description in the UI: the answer, in words (the experiment keeps its last one beside none)
            tracker.set_note(sweep_note(outcome), answered=outcome.best is not None)
        except Exception as exc:  # noqa: BLE001 - the trials are done; say what was not recorded
            echo(f"WARNING: could not close the MLflow parent run ({type(exc).__name__}: {exc})")

    def _publish_report(self, outcome: SweepOutcome) -> None:
        from sweeps.results.plots import publish

        try:
            publish(outcome, self.tracker.client)
            self.echo(f"report: figures and summary.html logged under report/ on parent run {outcome.parent_run_id}")
        except Exception as exc:  # noqa: BLE001 - figures are secondary; the runs are already logged
            self.echo(f"WARNING: could not draw the report figures ({type(exc).__name__}: {exc}); the runs are complete")
