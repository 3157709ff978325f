"""Progress output: one plain line per trial event everywhere; on a terminal, also one live status
line rewritten in place, never written to a log that is not a terminal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sweeps.results.outcome import TrialRow
from sweeps.service.progress import ProgressLine, Terminal, progress_line
from sweeps.spec import parse_spec

SPEC = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 4, num_steps: 2}\n")
METRIC = "throughput/samples_per_s"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _events() -> list[str]:
    rows = [TrialRow(f"t{i}", i, {}, status="running") for i in (1, 2, 3)]
    lines: list[str] = []
    for i, (status, value) in enumerate([("ok", 100.0), ("oom", None), ("ok", 250.0)]):
        row = rows[i]
        row.status, row.verdict = status, "underutilised: rank busy only 50%"
        row.reason = "" if status == "ok" else "CUDA out of memory"
        if value is not None:
            row.metrics[METRIC] = value
        lines.append(progress_line(SPEC, row, rows, elapsed=10.0 * (i + 1)))
    return lines


def test_each_event_is_one_line_with_the_sweep_status() -> None:
    lines = _events()
    assert all(isinstance(line, ProgressLine) and "\n" not in line for line in lines)
    assert lines[0] == (f"[trial 1/4] {METRIC}=100 [underutilised] | done 1/4, running 2, failed 0 | "
                        f"best {METRIC}=100 (trial 1) | elapsed 10s, ETA 30s")
    assert lines[1].startswith("[trial 2/4] FAILED (oom: CUDA out of memory) | done 2/4, running 1, failed 1")
    assert lines[2].status.best == f"{METRIC}=250 (trial 3)" and lines[2].status.eta_s == pytest.approx(10.0)


def test_a_log_that_is_not_a_terminal_gets_the_event_lines_only() -> None:
    out = io.StringIO()
    echo = Terminal(out)
    echo("[trial 1/4] t1 started: batch_size=32")
    for line in _events():
        echo(line)
    echo.close()
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    assert text.splitlines() == ["[trial 1/4] t1 started: batch_size=32", *_events_text()]


def _events_text() -> list[str]:
    return [str(line) for line in _events()]


def test_a_terminal_also_gets_one_live_status_line_rewritten_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    out = Tty()
    echo = Terminal(out)
    events = _events()
    echo("[trial 1/4] t1 started")  # no status yet: nothing drawn
    assert out.getvalue() == "[trial 1/4] t1 started\n"
    echo(events[0])
    drawn = out.getvalue()
    assert drawn.endswith("\r") and "done 1/4, running 2, failed 0" in drawn.rsplit("\n", 1)[1]
    echo("[trial 4/4] t4 started")  # the status is cleared, the line printed, the status redrawn under it
    after = out.getvalue()[len(drawn):]
    assert after.startswith("\r\x1b[K[trial 4/4] t4 started\n") and after.endswith("\r") and "done 1/4" in after
    echo(events[2])
    assert "best " + METRIC + "=250 (trial 3)" in out.getvalue().rsplit("\n", 1)[1]
    echo.close()
    assert out.getvalue().endswith("\r\x1b[K")  # the final output starts on a clean line
    # what the terminal shows (each line's text after its last \r): the event lines, whole, and nothing else
    shown = [seg.replace("\x1b[K", "").split("\r")[-1] for seg in out.getvalue().split("\n")]
    assert shown == ["[trial 1/4] t1 started", str(events[0]), "[trial 4/4] t4 started", str(events[2]), ""]


def test_dumb_terminal_gets_no_live_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "dumb")
    out = Tty()
    echo = Terminal(out)
    echo(_events()[0])
    assert "\r" not in out.getvalue()


def test_the_overhead_line_splits_probe_warm_up_and_the_services_own_cost() -> None:
    from sweeps.service.progress import overhead_line

    def ended(loop: float, warm: float, window: float) -> TrialRow:
        return TrialRow("t", 1, {}, status="ok", metrics={"time/loop_total_s": loop, "time/warmup_s": warm,
                                                          "time/window_s": window})

    # the H100 probe sweep's shape: 4 loops ended (74.8 s in all), one trial failed oom, a 40 s probe
    rows = [ended(20.0, 12.0, 6.0), ended(18.8, 10.0, 6.0), ended(18.0, 9.0, 6.0), ended(18.0, 9.0, 6.0),
            TrialRow("f", 5, {}, status="oom")]
    one = [(2, 12.2, "first")]
    line = overhead_line(rows, 185.6, one, probe_s=40.0)
    assert line == ("warm worker groups: 1 started for 5 trial(s) (the first 12.2 s); sweep wall 185.6 s = memory probe 40.0 s + trial "
                    "loops 74.8 s (warm-up incl. compile 40.0 s, measured 24.0 s, validation and the rest 10.8 s) + "
                    "the service's own 70.8 s, 14.2 s per trial; 1 trial(s) without a final report count in the "
                    "service's share")
    two = [(2, 12.0, "first"), (2, 13.0, "first")]
    assert overhead_line(rows[:4], 50.0, two) == (  # two at a time: the loops overlap in wall time
        "warm worker groups: 2 started for 4 trial(s) (the first 12.5 s); sweep wall 50.0 s, trial loops 74.8 s in all (warm-up incl. "
        "compile 40.0 s, measured 24.0 s, validation and the rest 10.8 s): the trials overlapped, so the service's "
        "own cost cannot be told apart")
    rows[0].metrics["time/data_prep_s"] = 9.7  # the first trial wrote the node's data files during its build
    assert "(warm-up incl. compile 40.0 s, of it 9.7 s making data, measured 24.0 s," in overhead_line(rows, 185.6, one)
    churn = [(1, 12.0, "first"), (2, 9.0, "resize"), (1, 7.0, "resize"), (2, 8.0, "replace")]
    assert overhead_line(rows, 185.6, churn).startswith(
        "warm worker groups: 4 started for 5 trial(s) (2 restarts to change the worker count (or type), 8.0 s each; 1 restart to "
        "replace a failed group, 8.0 s each; the first 12.0 s); ")
    assert overhead_line([TrialRow("f", 1, {}, status="oom")], 10.0, None) == (
        "one Ray Train run per trial; no trial ran its loop to the end, so no overhead figure")


def test_a_trial_line_shows_its_throughputs_spread_where_measured() -> None:
    row = TrialRow("t1", 1, {}, status="ok", verdict="compute-bound: busy",
                   metrics={METRIC: 510.9, "throughput/samples_per_s_cv_pct": 2.345})
    line = progress_line(SPEC, row, [row], elapsed=5.0)
    assert line.startswith("[trial 1/4] throughput/samples_per_s=510.9 (cv 2.3% over its window) [compute-bound] |")


def test_the_planned_cost_is_trials_times_the_boxed_trial_by_concurrency() -> None:

    from sweeps.service.progress import planned_cost

    demo = parse_spec((Path(__file__).resolve().parents[2] / "examples" / "demo.yaml").read_text())
    line = planned_cost(demo)
    assert "8 trial(s), 1 at a time" in line and "<= 3 s of warm-up + <= 5 s measured" in line
    assert "8 x 8 s = 64 s of training" in line
    two = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 5, num_steps: 20, "
                     "max_concurrent_trials: 2}\n")
    assert "3 x 8 s = 24 s" in planned_cost(two)  # 5 trials 2 at a time: 3 rounds of the CPU boxes
    data = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 2, num_samples: 4096}\n")
    assert "not time-boxed (it follows the data budget)" in planned_cost(data)
    # on a GPU a window lasts at least min_window_s (10 s) and at most max_window_s (30 s): the H200's GPT-2 sweep
    # trained 135 s of the "320 s" its plan then said
    gpu = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 8, num_steps: 30}\n"
                     "scaling: {use_gpu: true}\n")
    assert "<= 10 s of warm-up + 10-30 s measured" in planned_cost(gpu) and "8 x 10-40 s = 80-320 s" in planned_cost(gpu)
    same = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 2, num_steps: 30, min_window_s: 5, "
                      "max_window_s: 5}\n")  # floor = ceiling: one figure
    assert "<= 3 s of warm-up + 5 s measured" in planned_cost(same) and "2 x 5-8 s = 10-16 s" in planned_cost(same)


def test_the_eta_counts_what_the_ended_trials_cost_not_the_sweeps_start_up() -> None:
    from sweeps.service.progress import Costs, TrialCost, remaining_s, sweep_status

    spec8 = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 8, num_steps: 2}\n")
    rows = [TrialRow("t1", 1, {"precision": "32"}, status="ok")]
    assert remaining_s(spec8, rows, Costs([TrialCost("32", 10.0)])) == 70.0
    rows += [TrialRow("t2", 2, {"precision": "32"}, status="ok"), TrialRow("t3", 3, {"precision": "32"})]
    two = Costs([TrialCost("32", 10.0), TrialCost("32", 12.0)], running=[("32", 4.0)])
    assert remaining_s(spec8, rows, two) == 5 * 11.0 + 7.0  # the running one: what is left of the mean
    status = sweep_status(spec8, rows[:1], elapsed=40.0, costs=Costs([TrialCost("32", 10.0)]))  # 30 s went to start-up
    assert status.eta_s == 70.0  # not 40 s x 7


def test_the_eta_prices_each_precision_by_its_own_trials_and_an_emulated_one_at_its_boxes() -> None:
    from sweeps.service.progress import Costs, TrialCost, remaining_s

    demo = parse_spec((Path(__file__).resolve().parents[2] / "examples" / "demo.yaml").read_text())  # boxes 3 + 5 s
    first = [TrialRow("t1", 1, {"precision": "32"}, status="ok")]  # the grid's first point; 3 fp32, 4 bf16 to come
    fp32 = TrialCost("32", 6.0, window_s=5.0, warmup_steps_s=0.5)  # 0.5 s beyond its timed warm-up and window
    assert remaining_s(demo, first, Costs([fp32])) == 7 * 6.0  # bf16 native here: no reason to price it apart
    # bf16 measured emulated before the trials: its trials run into both boxes, 0.5 + 3 + 5 s each
    assert remaining_s(demo, first, Costs([fp32], emulated=frozenset({"bf16-mixed"}))) == 3 * 6.0 + 4 * 8.5
    # once a bf16 trial ended, bf16 is priced by what it cost
    rows = first + [TrialRow(f"t{i}", i, {"precision": "32"}, status="ok") for i in (2, 3, 4)] + \
        [TrialRow("t5", 5, {"precision": "bf16-mixed"}, status="ok")]
    ended = [fp32] * 4 + [TrialCost("bf16-mixed", 11.0, window_s=5.0, warmup_steps_s=4.0)]
    assert remaining_s(demo, rows, Costs(ended, emulated=frozenset({"bf16-mixed"}))) == 3 * 11.0
    # a sampler's trials (no grid): priced at the mean over the precision choices
    tpe = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nspace: {precision: {type: categorical, choices: "
                     "['32', 'bf16-mixed']}}\nbudget: {num_trials: 3, num_steps: 2}\n")
    one = [TrialRow("t1", 1, {"precision": "32"}, status="ok")]
    assert remaining_s(tpe, one, Costs([fp32], emulated=frozenset({"bf16-mixed"}))) == 2 * (6.0 + 8.5) / 2


def test_the_data_a_trial_made_for_the_node_is_not_priced_into_the_trials_after_it() -> None:
    from sweeps.service.progress import Costs, TrialCost, remaining_s

    # illustrative figures, in the shape of the H200 run of 2026-11-26: trial 1 wrote the data files
    spec8 = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 8, num_steps: 2}\n")
    rows = [TrialRow("t1", 1, {"precision": "32"}, status="ok")]
    first = TrialCost.of("32", 40.0, {"time/data_prep_s": 25.0, "time/window_s": 10.0})
    assert first.again_s(True) == 15.0 and first.again_s(False) == 40.0
    assert remaining_s(spec8, rows, Costs([first])) == 7 * 15.0  # not 7 x 40
    assert TrialCost.of("32", 3.0, {"time/data_prep_s": 4.0}).again_s(True) == 0.0  # never below nothing
    # a searched trainable param may shape the data (here the rows): each trial to come may make its own
    searched = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nspace: {params.num_train_rows: {type: "
                          "categorical, choices: [1024, 2048]}}\nbudget: {num_trials: 2, num_steps: 2}\n")
    assert remaining_s(searched, rows, Costs([first])) == 40.0
    # an emulated precision: what the ended trial cost beyond its boxes, less the data it made, plus both boxes
    demo = parse_spec((Path(__file__).resolve().parents[2] / "examples" / "demo.yaml").read_text())  # boxes 3 + 5 s
    fp32 = TrialCost("32", 9.0, window_s=5.0, warmup_steps_s=0.5, data_prep_s=3.0)  # 0.5 s beyond, once made
    assert remaining_s(demo, rows, Costs([fp32], emulated=frozenset({"bf16-mixed"}))) == 3 * 6.0 + 4 * 8.5


def test_once_a_warmed_process_ran_a_trial_a_groups_first_trial_no_longer_sets_the_price() -> None:
    from sweeps.service.progress import Costs, TrialCost, remaining_s

    # in the shape of the H200's GPT-2 sweep: trial 1 paid the process's first use of the GPU, trial 2 did not
    grid = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nspace: {precision: {type: categorical, choices: "
                      "['32', 'tf32']}, batch_size: {type: categorical, choices: [8, 16]}}\nsearch: {algorithm: grid}\n"
                      "budget: {num_trials: 4, num_steps: 2}\n")
    first = TrialCost.of("32", 40.0, {"pool/trial_in_group": "1"})
    second = TrialCost.of("32", 15.0, {"pool/trial_in_group": "2"})
    assert first.fresh is True and second.fresh is False
    assert TrialCost.of("32", 9.0, {}).fresh is None  # unknown: a cold trial, or one that ended without a final report
    one = [TrialRow("t1", 1, {"precision": "32"}, status="ok")]
    assert remaining_s(grid, one, Costs([first])) == 3 * 40.0  # all it knows yet: the first trial's cost
    two = one + [TrialRow("t2", 2, {"precision": "32"}, status="ok")]
    assert remaining_s(grid, two, Costs([first, second])) == 2 * 15.0  # two tf32 to come, at the warmed trial's cost
    # cold trials (every one fresh): the mean of all, as before
    assert remaining_s(grid, two, Costs([TrialCost("32", 40.0), TrialCost("32", 15.0)])) == 2 * 27.5
    # a pruned or failed trial (no final report, so no fact) still counts once a warmed one ended
    pruned = TrialCost.of("32", 3.0, {})
    assert remaining_s(grid, two, Costs([first, second, pruned])) == 2 * 9.0


def test_what_the_time_boxes_bound_leaves_out_the_build_and_step_0() -> None:
    from sweeps.service.progress import TrialCost

    # time/warmup_s holds the build, compilation and step 0; only the timed steps after them are boxed
    assert TrialCost.of("32", 9.0, {"time/warmup_s": 4.0, "time/warmup_steps_s": 2.5, "time/window_s": 5.0}).boxed_s(True) == 7.5
    assert TrialCost.of("32", 9.0, {"time/warmup_s": 4.0, "time/window_s": 5.0}).boxed_s(True) == 5.0  # warm-up too short to time
    assert TrialCost.of("32", 9.0, {}).boxed_s(True) == 0.0
    # a window box without a warm-up box (e.g. only max_window_s with a quality constraint): warm-up is the trial's
    assert TrialCost.of("32", 9.0, {"time/warmup_steps_s": 2.5, "time/window_s": 5.0}).boxed_s(False) == 5.0



def test_grid_points_that_will_never_run_leave_the_eta_and_are_counted_as_skipped() -> None:
    from sweeps.service.progress import Costs, TrialCost, remaining_s, sweep_status

    demo = parse_spec((Path(__file__).resolve().parents[2] / "examples" / "demo.yaml").read_text())  # 8 points
    first = [TrialRow("t1", 1, {"precision": "32"}, status="ok")]  # 3 fp32 and 4 bf16 points to come
    fp32 = TrialCost("32", 6.0)
    # two bf16 points out of memory bounds (search.grid_skips): 3 fp32 + 2 bf16 left, at fp32's price here
    assert remaining_s(demo, first, Costs([fp32], skipped=["bf16-mixed", "bf16-mixed"])) == 5 * 6.0
    status = sweep_status(demo, first, elapsed=9.0, costs=Costs([fp32], skipped=["bf16-mixed", "bf16-mixed"]))
    assert "done 1/8 (2 skipped: out of memory bounds)" in status.text() and not status.over
    rows = first + [TrialRow(f"t{i}", i, {"precision": "32"}, status="oom") for i in range(2, 7)]
    last = sweep_status(demo, rows, elapsed=40.0, costs=Costs([fp32] * 6, skipped=["bf16-mixed"] * 2))
    assert last.over and last.eta_s == 0.0  # 6 ran, 2 never will: nothing is left to wait for
    # without trial costs (a resumed sweep's earlier trials), the mean time per trial, over the 5 to come
    assert sweep_status(demo, first, elapsed=9.0, costs=Costs([], skipped=["bf16-mixed"] * 2)).eta_s == 9.0 * 5


def test_the_eta_is_never_shorter_than_what_the_longest_running_trial_has_left() -> None:
    from sweeps.service.progress import Costs, TrialCost, remaining_s

    two = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 3, num_steps: 2, "
                     "max_concurrent_trials: 2}\n")
    rows = [TrialRow("t1", 1, {"precision": "32"}, status="ok"), TrialRow("t2", 2, {"precision": "32"}),
            TrialRow("t3", 3, {"precision": "32"})]
    # two slots, nothing waiting: one trial 2 s in, one 8 s in, each priced at 10 s
    costs = Costs([TrialCost("32", 10.0)], running=[("32", 2.0), ("32", 8.0)])
    assert remaining_s(two, rows, costs) == 8.0  # not (8 + 2) / 2: one trial's 8 s are not shared by the slots


def test_the_eta_prices_the_restarts_the_plan_expects_and_stops_where_the_space_does() -> None:
    from sweeps.search.plan import SizeRuns
    from sweeps.service.progress import Costs, TrialCost, planned_cost, remaining_s

    spec = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nspace:\n  num_workers: {type: categorical, choices: "
                      "[1, 2]}\n  batch_size: {type: categorical, choices: [16, 32, 64]}\nbudget: {num_trials: 12, "
                      "num_steps: 2}\n")
    runs = SizeRuns.of(spec)
    assert runs is not None and runs.run_length == 4  # 12 / (2 counts + 1)
    runs.handed(1)  # trial 1 ran on the pool's first group, 1 rank
    assert runs.upcoming(11) == [1, 1, 1, 2, 2, 2, 2, None, None, None, None]
    assert runs.expected_restarts(11) == 1.5  # to 2 ranks, then half a chance at the free run's start
    rows = [TrialRow("a", 1, {"precision": "32"}, status="ok")]
    costs = Costs([TrialCost("32", 5.0)], group_start_s=8.0, restarts=runs.expected_restarts(11))
    assert remaining_s(spec, rows, costs) == 11 * 5.0 + 1.5 * 8.0
    # the space has 6 configurations: the search stops after them (search.when_exhausted: stop)
    stopping = Costs([TrialCost("32", 5.0)], space_left=5)
    assert remaining_s(spec, rows, stopping) == 5 * 5.0
    assert "planned: 6 trial(s)" in planned_cost(spec, 8.0) and "(the space has 6 configurations; none runs twice)" \
        in planned_cost(spec, 8.0)


def test_the_overhead_line_counts_a_wait_for_resources_apart_from_the_services_own_cost() -> None:
    from sweeps.service.progress import overhead_line

    # in the shape of sweep u1 of the three on one head: its group waited ~60 s for another sweep's to be released
    rows = [TrialRow(f"t{i}", i, {}, status="ok", metrics={"time/loop_total_s": 4.0}) for i in (1, 2, 3, 4)]
    line = overhead_line(rows, 100.0, [(2, 4.5, "first")], waited_s=60.2)
    assert line == ("warm worker groups: 1 started for 4 trial(s) (the first 4.5 s); sweep wall 100.0 s = trial loops "
                    "16.0 s + waiting 60.2 s for resources other work held + the service's own 23.8 s, 5.9 s per trial")
    assert "waiting" not in overhead_line(rows, 100.0, [(2, 4.5, "first")])  # none waited: the line as before
    assert overhead_line([TrialRow("f", 1, {}, status="interrupted")], 30.0, [], waited_s=20.1) == (
        "warm worker groups: 0 started for 1 trial(s); no trial ran its loop to the end, so no overhead figure (it "
        "waited 20.1 s for resources other work held)")  # halted by budget.max_queue_s
    # a wait beside a running trial (two slots): wall time that loops and waits both claim cannot be split
    assert overhead_line(rows, 70.0, [(2, 4.5, "first")] * 2, waited_s=60.2).endswith(
        "trial loops 16.0 s in all, waiting 60.2 s for resources other work held: the trials and waits overlapped, "
        "so the service's own cost cannot be told apart")


def test_the_eta_is_a_range_once_contention_changed_during_the_sweep() -> None:
    from sweeps.service.progress import Costs, TrialCost, eta_range, sweep_status

    spec = parse_spec("name: p\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 8, num_steps: 2}\n")
    rows = [TrialRow(f"t{i}", i, {"precision": "32"}, status="ok") for i in (1, 2, 3)]
    alone = TrialCost.of("32", 10.0, {"contention/cpu_other_cores": 0.1})
    shared = TrialCost.of("32", 22.0, {"contention/cpu_other_cores": 1.8})  # another sweep's trial beside it
    assert (alone.contended, shared.contended, TrialCost.of("32", 9.0, {}).contended) == (False, True, None)
    # trial 1 alone, then another sweep started: 5 to come at 10 s or at 22 s, not at the mean of the three
    costs = Costs([alone, shared, shared])
    assert eta_range(spec, rows, costs) == (50.0, 110.0)
    status = sweep_status(spec, rows, elapsed=60.0, costs=costs)
    assert status.text().endswith("ETA 50-110s") and status.text(status.at + 60.0).endswith("ETA up to 50s")
    # every ended trial measured alike: one figure, as before
    assert eta_range(spec, rows, Costs([shared] * 3)) == (110.0, None)
    assert sweep_status(spec, rows, 60.0, Costs([shared] * 3)).text().endswith("ETA 110s")
    # the running trials report other conditions than every ended trial had: an open end
    assert sweep_status(spec, rows, 60.0, Costs([alone] * 3, now_contended=True)).text().endswith("ETA 50s or more")
    assert sweep_status(spec, rows, 60.0, Costs([shared] * 3, now_contended=False)).text().endswith("ETA up to 110s")
    assert eta_range(spec, rows, Costs([alone] * 3, now_contended=False)) == (50.0, None)
