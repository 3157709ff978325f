"""What a sweep keeps on disk to be resumed: `<storage_path>/<name>/sweep.json`.

It records the spec (its text and a hash of its validated form), the MLflow parent run and
the token that ties the sweep's searcher, stopper and callback together. Ray Tune keeps the
rest (trial states, the Optuna study) in the same folder. The trial -> MLflow run mapping is
not kept here but on the runs themselves (tag `sweep.trial_id` on each child of the parent).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sweeps.spec import SweepSpec, parse_spec

STATE_FILE = "sweep.json"


class SweepExists(ValueError):
    """Another sweep already lives under this name in the storage path."""


def spec_digest(spec: SweepSpec) -> str:
    """Hash of the validated spec: comments, formatting and where it is stored do not count."""
    return hashlib.sha256(spec.model_dump_json(exclude={"storage_path"}).encode()).hexdigest()


def experiment_dir(spec: SweepSpec) -> Path:
    return Path(spec.storage_path).resolve() / spec.name


def resume_command(spec: SweepSpec) -> str:
    return f"sweeps resume {spec.name} --storage-path {spec.storage_path}"


@dataclass
class SweepState:
    spec_text: str
    token: str
    parent_run_id: str
    tracking_uri: str
    spec_sha256: str = ""

    def write(self, exp_dir: Path) -> None:
        exp_dir.mkdir(parents=True, exist_ok=True)
        if not self.spec_sha256:
            self.spec_sha256 = spec_digest(parse_spec(self.spec_text))
        tmp = exp_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(exp_dir / STATE_FILE)  # atomic: a kill never leaves half a file

    @classmethod
    def read(cls, exp_dir: Path) -> SweepState:
        return cls(**json.loads((exp_dir / STATE_FILE).read_text()))

    @classmethod
    def find(cls, spec: SweepSpec, spec_text: str, restart: bool = False,
             echo: Callable[[str], None] = print) -> SweepState | None:
        """The state of this sweep to resume, None to start afresh; SweepExists for a clash."""
        exp_dir = experiment_dir(spec)
        if not exp_dir.exists():
            return None
        if restart:
            aside = exp_dir.with_name(f"{spec.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
            exp_dir.rename(aside)
            echo(f"moved the earlier sweep {spec.name} aside to {aside}; starting afresh")
            return None
        how = (f"To continue that one: {resume_command(spec)}. "
               f"To start this one: rename it (name: {spec.name}-2) or run it with --restart, which moves the old "
               f"one aside")
        if not (exp_dir / STATE_FILE).exists():
            if (exp_dir / "tuner.pkl").exists():
                raise SweepExists(f"{exp_dir} holds a Ray Tune experiment that is not a sweep of this tool. "
                                  f"Rename the sweep (name: {spec.name}-2) or run it with --restart")
            return None
        state = cls.read(exp_dir)
        if state.spec_sha256 != spec_digest(spec):
            raise SweepExists(f"a different sweep named {spec.name!r} already exists in {exp_dir} (its spec differs). {how}.")
        from ray import tune

        if not tune.Tuner.can_restore(str(exp_dir)):
            echo(f"the earlier run of {spec.name} stopped before Ray Tune saved any state; starting it afresh")
            exp_dir.rename(exp_dir.with_name(f"{spec.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"))
            return None
        return state


def load_for_resume(storage_path: str, name: str) -> tuple[SweepSpec, str]:
    """The spec of sweep `name` saved under `storage_path`, for `sweeps resume`."""
    exp_dir = Path(storage_path).resolve() / name
    if not (exp_dir / STATE_FILE).exists():
        found = sorted(p.parent.name for p in Path(storage_path).resolve().glob(f"*/{STATE_FILE}"))
        raise SweepExists(f"no sweep named {name!r} in {Path(storage_path).resolve()}"
                          + (f"; sweeps there: {', '.join(found)}" if found else "") + ". Check --storage-path")
    state = SweepState.read(exp_dir)
    spec = parse_spec(state.spec_text, f"{exp_dir / STATE_FILE}")
    return spec.model_copy(update={"storage_path": str(Path(storage_path).resolve())}), state.spec_text
