"""What a sweep keeps on disk (`sweeps/service/saved_state.py`): `sweep.json` and the sweep's lock."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

CPU = torch.device("cpu")




def test_the_saved_state_round_trips_and_a_second_holder_of_the_lock_is_refused(tmp_path: Path) -> None:
    from sweeps.service.saved_state import STATE_FILE, SweepLocked, SweepState, same_spec, sweep_lock
    from sweeps.spec import parse_spec

    text = f"name: s\ntrainable: {{name: mlp-tabular}}\nbudget: {{num_trials: 1, num_steps: 2}}\nstorage_path: {tmp_path}\n"
    state = SweepState(text, "tok", "run-1", "sqlite:///x")
    state.write(tmp_path / "s")
    assert SweepState.read(tmp_path / "s") == state and (tmp_path / "s" / STATE_FILE).exists()
    spec = parse_spec(text)
    assert same_spec(text, spec) and same_spec("# a comment\n" + text, spec)
    assert not same_spec(text.replace("num_steps: 2", "num_steps: 3"), spec) and not same_spec("name: [", spec)
    with sweep_lock(spec):
        with pytest.raises(SweepLocked, match=r"sweep s is already running: pid \d+ on host "):
            with sweep_lock(spec):
                pass
    with sweep_lock(spec):  # released when its holder left
        pass
