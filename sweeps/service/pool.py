"""Warm worker groups: Ray Train's start-up paid once per slot and sweep, not once per trial.

```
 Tune trial (0-CPU driver, sweeps.service.trial)          TrialQueue (actor)          warm group (one Train run per slot)
   submit(trial, config) ───────────────────────►  pending ──take(slot)──────►  rank 0 ─broadcast─► every rank:
   events(trial) ◄── report / final / failed ────  events  ◄──post(report)───     reset, build, loop (unchanged)
   tune.report(metrics)  (→ Tune, Optuna, MLflow)          ◄──rank_done────      keep serving, or retire
 GroupSupervisor (actor, one per slot): TorchTrainer(pool_worker).fit() again whenever a group retires
```

The queue decides after each trial whether a group may serve again: every rank must say how the
trial ended within `_AGREE_S`, and every rank must have finished or failed cleanly (see
`trainables.train_functions`). A group that died outright (a rank's process crashed) is reported by
its supervisor for the trial it was serving.

**Shapes.** A trial runs on its own number of ranks (`TrialConfig.num_workers`, searched as
`space.num_workers`) of its own accelerator type (`accelerator_type`, searched as
`space.accelerator_type`): its shape. A group serves only trials of its own shape: it takes the oldest
waiting trial of its shape. An idle group that finds only trials of other shapes waiting, none of which
another idle group of that shape (or one already being resized to it) will take, ends (`POOL_RESIZE`)
and its supervisor starts a group of the shape the oldest of them needs. So a slot never holds more
than the largest trial, and the pool stays within what `max_concurrent_trials` trials need; each
resize costs one group start (grid search walks the types and worker counts slowest, resizing once per
shape).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

import ray

from sweeps.search.trials import first_shape
from sweeps.spec import SweepSpec
from trainables.contract import FINAL
from trainables.contract import POOL_CLOSED as CLOSED
from trainables.contract import POOL_RESIZE as RESIZE

logger = logging.getLogger(__name__)

# How long ranks that ended a trial cleanly wait for the others before the group retires: ranks that
# fail symmetrically (a config error at build, OOM at the same step) arrive within a step or a build.
_AGREE_S = 20.0


class Queue:
    """Trials waiting for a warm group, and what each trial's group reported back (threaded actor)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._pending: collections.deque[tuple[str, dict[str, Any], str | None, str]] = collections.deque()
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._cancelled: set[str] = set()
        self._serving: dict[int, str] = {}  # slot -> the trial its group took last
        self._done: dict[str, dict[int, tuple[BaseException | None, bool]]] = {}
        self._decided: dict[str, bool] = {}
        self._where: dict[str, dict[int, str]] = {}  # where in the loop each rank's trial ended
        self._idle: dict[int, Shape | None] = {}  # slot -> the shape of its group, while it waits in take()
        self._resizing: dict[int, Shape] = {}  # slot -> the shape its next group is started with
        self._began: dict[str, float] = {}  # trial -> when it was submitted, or taken if it had to wait for a group
        self._waited: set[str] = set()  # trials submitted while no group that takes them was waiting
        self._ended: dict[str, float] = {}  # trial -> when its group posted its final report
        self._starting: dict[int, tuple[float, Shape, str]] = {}  # slot -> (since, shape, why) of a group starting
        self._starts: list[tuple[Shape, float, str]] = []  # each group's (shape, seconds to its first take less its wait, why)
        self._waits: dict[int, float] = {}  # slot -> seconds its starting group waited for resources (`group_waited`)
        self._lives: list[tuple[Shape, float, float | None]] = []  # each group's (shape, asked for, ended or None)
        self._living: dict[int, int] = {}  # slot -> its group's index in _lives
        self._unheld: dict[int, float] = {}  # a group's index in _lives -> seconds it waited, holding nothing
        self._closed = False

    # -- the Tune trial's side ---------------------------------------------------------------
    def submit(self, trial_id: str, config: dict[str, Any], resume_from: str | None, checkpoint_dir: str) -> None:
        with self._cv:
            self._events[trial_id] = []
            self._cancelled.discard(trial_id)
            self._done.pop(trial_id, None)
            self._decided.pop(trial_id, None)
            self._pending.append((trial_id, config, resume_from, checkpoint_dir))
            self._began[trial_id] = time.time()
            self._ended.pop(trial_id, None)
            self._waited.discard(trial_id)
            shape = _shape(self._pending[-1])
            if not any(_takes(s, shape) for s in self._idle.values()):
                self._waited.add(trial_id)  # no group that takes it is waiting: it waits for one to start
            self._cv.notify_all()

    def events(self, trial_id: str, since: int, timeout_s: float) -> list[dict[str, Any]] | None:
        """Return the trial's events after the first `since` (waiting up to `timeout_s`).

        None once the pool is closed and nothing more will come."""
        with self._cv:
            self._cv.wait_for(lambda: len(self._events.get(trial_id, ())) > since or self._closed, timeout_s)
            new = list(self._events.get(trial_id, [])[since:])
            return None if self._closed and not new else new

    def cancel(self, trial_id: str) -> None:
        """The driver stopped waiting: a pending trial is dropped, a running one stops at its next report."""
        with self._cv:
            self._cancelled.add(trial_id)
            self._pending = collections.deque(p for p in self._pending if p[0] != trial_id)
            self._cv.notify_all()

    # -- the warm group's side ---------------------------------------------------------------
    # -- group starts: what each cost, for the overhead line, the plan and the ETA ----------
    def group_starting(self, slot: int, shape: Shape, why: str) -> None:
        """Record that a slot's supervisor starts a group.

        `why`: "first", "resize" to another shape, or "replace" one that failed; its start ends when the group first
        asks for a trial."""
        with self._cv:
            self._starting[slot] = (time.time(), shape, why)
            self._waits.pop(slot, None)
            self._living[slot] = len(self._lives)
            self._lives.append((shape, time.time(), None))

    def starting(self) -> dict[int, tuple[float, int]]:
        """The groups starting now: slot -> (when it began to start, its ranks)."""
        with self._cv:
            return {slot: (since, shape[0]) for slot, (since, shape, _) in self._starting.items()}

    def group_waited(self, slot: int, seconds: float) -> None:
        """Record that the slot's starting group waited `seconds` more for resources that other work held.

        Its placement group was pending (`sweeps.service.waits`): that much of its start is waiting, not starting,
        and it held nothing meanwhile."""
        with self._cv:
            if slot in self._starting:
                self._waits[slot] = self._waits.get(slot, 0.0) + seconds
                life = self._living.get(slot)
                if life is not None:
                    self._unheld[life] = self._unheld.get(life, 0.0) + seconds

    def group_ended(self, slot: int) -> None:
        """A slot's group ended (its Train run returned or failed, its workers released)."""
        with self._cv:
            i = self._living.pop(slot, None)
            if i is not None:
                shape, began, _ = self._lives[i]
                self._lives[i] = (shape, began, time.time())

    def group_lives(self) -> list[tuple[Shape, float, bool]]:
        """Return what each group held, from asking for its devices to its end or now.

        Per group: (its shape, seconds from asking for its devices to its end or now, less what it waited for them
        while other work held them, whether it has ended). A group's devices are the sweep's for all that time,
        between trials too."""
        with self._cv:
            now = time.time()
            return [(shape, max(0.0, (end or now) - began - self._unheld.get(i, 0.0)), end is not None)
                    for i, (shape, began, end) in enumerate(self._lives)]

    def group_starts(self) -> list[tuple[Shape, float, str]]:
        """Return each group started so far.

        Per group: (its shape, the seconds until it first asked for a trial less those it waited for resources, why)."""
        with self._cv:
            return list(self._starts)

    def wait_started(self, timeout_s: float) -> list[tuple[Shape, float, str]]:
        """`group_starts` once a first group is up (or `timeout_s` passed)."""
        with self._cv:
            self._cv.wait_for(lambda: bool(self._starts) or self._closed, timeout_s)
            return list(self._starts)

    def take(self, slot: int, timeout_s: float, shape: Shape | None = None) -> Any:
        """Hand a group of `shape` its next trial, or tell it to end.

        The oldest waiting trial for a group of `shape` (None: any trial), CLOSED, RESIZE (this group should end: a
        group of another shape is wanted, `shape_for`), or None after `timeout_s`."""
        with self._cv:
            if slot in self._starting:  # the group's ranks are up: its start-up ends here
                since, started, why = self._starting.pop(slot)
                self._starts.append((started, max(0.0, time.time() - since - self._waits.pop(slot, 0.0)), why))
                self._cv.notify_all()
            self._resizing.pop(slot, None)
            self._idle[slot] = shape
            try:
                self._cv.wait_for(lambda: self._closed or self._mine(shape) is not None
                                  or self._wanted(slot) is not None, timeout_s)
                if self._closed:
                    return CLOSED
                item = self._mine(shape)
                if item is not None:
                    self._pending.remove(item)
                    self._serving[slot] = item[0]
                    if item[0] in self._waited:
                        self._began[item[0]] = time.time()
                    return item
                wanted = self._wanted(slot)
                if wanted is None:
                    return None
                self._resizing[slot] = wanted
                self._cv.notify_all()
                return RESIZE
            finally:
                self._idle.pop(slot, None)

    def span(self, trial_id: str) -> tuple[float | None, float | None]:
        """Return when the trial's own cost began and ended (`time.time()`).

        Began: its submission by its Tune trial (after that actor started), or when a group took it if it had to
        wait for one to start (the first trial of a sweep, a resize): the group's start-up is the sweep's cost, not
        a trial's. Ended: when its group posted the final report (None before): its way on to the driver (Tune,
        the trial's actor) is the sweep's, not the trial's."""
        with self._cv:
            return self._began.get(trial_id), self._ended.get(trial_id)

    def _mine(self, shape: Shape | None) -> tuple[str, dict[str, Any], str | None, str] | None:
        return next((p for p in self._pending if _takes(shape, _shape(p))), None)

    def _wanted(self, slot: int) -> Shape | None:
        """The shape the oldest waiting trial needs that no other idle group of that shape, nor a group
        being resized to it, will take; None when there is none (or this slot's group takes it)."""
        for trial_shape in dict.fromkeys(_shape(p) for p in self._pending):
            if _takes(self._idle.get(slot), trial_shape):
                continue
            waiting = sum(_shape(p) == trial_shape for p in self._pending)
            coming = sum(_takes(s, trial_shape) for k, s in self._idle.items() if k != slot) \
                + sum(s == trial_shape for s in self._resizing.values())
            if waiting > coming:
                return trial_shape
        return None

    def shape_for(self, slot: int, shape: Shape) -> Shape:
        """The shape of the slot's next group: the one a resize asked for, else `shape`."""
        with self._cv:
            return self._resizing.get(slot, shape)

    def post(self, trial_id: str, event: dict[str, Any]) -> bool:
        """Record a report; True when the trial was cancelled (its ranks stop)."""
        with self._cv:
            self._events.setdefault(trial_id, []).append(event)
            if event.get("metrics", {}).get(FINAL) == 1:
                self._ended[trial_id] = time.time()
            self._cv.notify_all()
            return trial_id in self._cancelled or self._closed

    def rank_done(self, trial_id: str, rank: int, world: int, error: BaseException | None, clean: bool,
                  where: str = "None") -> bool:
        """Record that a rank finished a trial, and return whether its group may serve another one.

        Waits (up to `_AGREE_S`) for the other ranks: a rank stuck in a collective never comes, so the group retires.
        A kept group's failure is posted at once; a retiring group's waits for its supervisor, whose
        error also names the ranks that died (a crash), so the trial's failure is classified whole."""
        with self._cv:
            done = self._done.setdefault(trial_id, {})
            done[rank] = (error, clean)
            self._where.setdefault(trial_id, {})[rank] = where
            self._cv.notify_all()
            # A rank that failed uncleanly retires the group at once: no need to wait for its peers
            # (they may be stuck in a collective it will never join).
            self._cv.wait_for(lambda: len(done) == world or trial_id in self._decided or not clean, _AGREE_S)
            if trial_id not in self._decided:
                # ...and at the same point of the loop (phase, step, micro-batch): ranks that failed at
                # different points may have issued different collectives (queued, under NCCL), and a
                # group with an orphaned collective would hang its next trial
                keep = (len(done) == world and all(c for _, c in done.values())
                        and len(set(self._where[trial_id].values())) == 1)
                self._decided[trial_id] = keep
                failures = {r: e for r, (e, _) in done.items() if e is not None}
                if keep and failures:
                    self._events[trial_id].append({"failed": failures, "retired": False})
                self._cv.notify_all()
            return self._decided[trial_id]

    def group_failed(self, slot: int, error: BaseException) -> None:
        """Record that a group's Train run ended in an error (it retired, or a rank died).

        The trial it was serving failed with it, unless that trial already ended with the group kept."""
        with self._cv:
            trial_id = self._serving.pop(slot, None)
            if trial_id is None and self._pending:
                # the group died before it took a trial (it could not start: a broken environment, a
                # bad GPU, a full disk): charge the next waiting trial, so the sweep sees the failure
                # (and its breaker stops a sweep whose groups can never start) instead of waiting
                trial_id = self._pending.popleft()[0]
            if trial_id is None or self._decided.get(trial_id) is True:
                return
            self._decided[trial_id] = False
            group = getattr(error, "worker_failures", None)
            failures: dict[Any, BaseException] = dict(group) if isinstance(group, dict) else {}
            # what the ranks themselves raised wins over the group's view of them (RetireGroup)
            failures.update({r: e for r, (e, _) in self._done.get(trial_id, {}).items() if e is not None})
            self._events.setdefault(trial_id, []).append({"failed": failures or {None: error}, "retired": True})
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def is_closed(self) -> bool:
        return self._closed


Shape = tuple[int, str]  # a group's ranks and accelerator type ("": not pinned)


def _shape(pending: tuple[str, dict[str, Any], str | None, str]) -> Shape:
    """The ranks (0: any, a config from before sizes were searched) and the type a waiting trial needs."""
    return int(pending[1].get("num_workers") or 0), str(pending[1].get("accelerator_type") or "")


def _takes(group: Shape | None, trial: Shape) -> bool:
    """Whether a group of shape `group` (None: any) serves a trial of shape `trial`."""
    return group is None or (trial[0] in (0, group[0]) and trial[1] == group[1])


# A threaded actor: trials wait in events(), groups in take() and rank_done(), all at once.
TrialQueue = ray.remote(num_cpus=0, max_concurrency=1000)(Queue)  # type: ignore[call-overload]


@ray.remote(num_cpus=0)
class GroupSupervisor:
    """Keeps one warm group running for a slot.

    A new Train run whenever the last one retired or ended to be resized (with the size the queue asks for)."""

    def run(self, queue: Any, slot: int, spec: SweepSpec, storage_path: str, name: str,
            workdir: str | None = None) -> int:
        from sweeps.service.trial import make_group_trainer

        groups, shape, why = 0, first_shape(spec), "first"
        while not ray.get(queue.is_closed.remote()):
            groups += 1
            shape = tuple(ray.get(queue.shape_for.remote(slot, shape)))  # a group that ended to resize named it
            ray.get(queue.group_starting.remote(slot, shape, why))
            trainer = make_group_trainer(spec, queue, slot, f"{name}-slot{slot}-group{groups}", storage_path,
                                         (workdir, shape))
            try:
                trainer.fit()
                why = "resize"  # it ended for a group of another shape (or the sweep is over)
            except Exception as exc:  # noqa: BLE001 - the served trial fails with it; a fresh group follows
                ray.get(queue.group_failed.remote(slot, exc))
                logger.info("slot %d: group %d retired (%s)", slot, groups, type(exc).__name__)
                why = "replace"
            finally:
                ray.get(queue.group_ended.remote(slot))  # its devices are free from here: priced to here
            if why == "replace":
                time.sleep(0.5)
        return groups


class WarmPool:
    """The queue and one supervised warm group per concurrency slot, for one sweep run.

    Every rank works in `workdir` (the driver's working directory) where that is on its node."""

    def __init__(self, spec: SweepSpec, storage_path: str, token: str, workdir: str | None = None) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # On the driver's node: a worker node that goes away must not take the queue or a slot's
        # supervisor with it (its group is replaced; they are not).
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.queue = TrialQueue.options(name=f"sweep-queue-{token}", scheduling_strategy=here).remote()  # type: ignore[attr-defined]
        slots = spec.budget.max_concurrent_trials
        self.supervisors = [GroupSupervisor.options(scheduling_strategy=here).remote()  # type: ignore[attr-defined]
                            for _ in range(slots)]
        self.runs = [s.run.remote(self.queue, i, spec, storage_path, f"{spec.name}-warm", workdir)
                     for i, s in enumerate(self.supervisors)]
        self.lives: list[tuple[Shape, float, bool]] = []  # each group's shape, seconds held, ended (after `join`)

    def close(self) -> None:
        """Ask every group to finish (their Ray Train runs wind down meanwhile: see `join`)."""
        ray.get(self.queue.close.remote())

    def join(self, timeout_s: float = 30.0) -> list[tuple[Shape, float, str]]:
        """Close the pool and wait for its groups; return each group that started.

        A group still waiting for resources (e.g. the replacement of one lost with its node) is stopped. Each
        group: (shape, seconds to start, why: first, resize, replace)."""
        self.close()
        ray.wait(self.runs, num_returns=len(self.runs), timeout=timeout_s)
        starts = ray.get(self.queue.group_starts.remote())
        self.lives = list(ray.get(self.queue.group_lives.remote()))
        for actor in [*self.supervisors, self.queue]:
            ray.kill(actor)
        return list(starts)
