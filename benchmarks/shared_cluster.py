"""Many sweeps on one cluster (issue 51): three identical small sweeps submitted with `ray job submit` within half
a second to one head (4 CPUs declared on this 2-core machine), tracking into one MLflow server, then the same
sweep alone on the same head. Per sweep: its answer (the best configuration), whether it agrees with the sweep
run alone or says that its ranking rests on contended trials, how many of its trials were marked contended, the
ETA printed after its first trial against the time that really remained (first_eta_error_pct = (ETA - remaining)
/ remaining x 100), and the waiting lines it printed. Goals: every trial that ran beside another sweep's is
marked; each answer agrees with the one run alone or says its ranking rests on contended trials; |first ETA
error| <= 25%.

    .venv/bin/python benchmarks/shared_cluster.py [--sweeps 3] [--num-cpus 4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, table

BIN = Path(sys.executable).parent
SPEC = """\
name: {name}
trainable: {{name: mlp-tabular}}
space:
  batch_size: {{type: categorical, choices: [16, 64]}}
  precision: {{type: categorical, choices: ["32", bf16-mixed]}}
search: {{algorithm: grid}}
budget: {{num_trials: 4, num_steps: 100000, num_warmup_steps: 3, max_warmup_s: 2, max_window_s: 4}}
scaling: {{num_workers: 2, cpus_per_worker: 1}}
telemetry: {{period_s: 0.5}}
tracking: {{uri: "{uri}", experiment: shared}}
storage_path: {storage}
"""
_ETA = re.compile(r"^\[trial 1/\d+\] .*\| elapsed (\d+)s, ETA (\d+)s")
_WALL = re.compile(r"^Sweep \S+ finished in (\d+)s")


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


@contextlib.contextmanager
def _process(cmd: list[str], env: dict[str, str], log: Path, ready_port: int) -> Any:
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_port(ready_port, 120)
            yield proc
        finally:
            import psutil

            ours = [proc, *psutil.Process(proc.pid).children(recursive=True)] if psutil.pid_exists(proc.pid) else []
            os.killpg(proc.pid, signal.SIGKILL)  # our own process group only
            for p in ours:
                with contextlib.suppress(Exception):
                    p.kill()
            proc.wait(timeout=30)


def _job(name: str, address: str, env: dict[str, str], work: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(work),
                             "--", "python", "-m", "sweeps", "run", f"{name}.yaml"], env=env, cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _said(name: str, out: str, client: Any) -> dict[str, Any]:
    lines = [line.strip() for line in out.splitlines()]
    eta = next((m for line in lines if (m := _ETA.search(line))), None)
    wall = next((m for line in lines if (m := _WALL.search(line))), None)
    row: dict[str, Any] = {"sweep": name, "wall_s": int(wall.group(1)) if wall else None}
    if eta and wall:
        remaining = int(wall.group(1)) - int(eta.group(1))
        row["first_eta_error_pct"] = round(100.0 * (int(eta.group(2)) - remaining) / max(remaining, 1), 1)
    row["waiting_lines"] = sum("waiting" in line and "worker group" in line for line in lines)
    exp = client.get_experiment_by_name("shared")
    runs = client.search_runs([exp.experiment_id], f"tags.`sweep.name` = '{name}'")
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    kids = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    best = next((k for k in kids if k.info.run_id == parent.data.tags.get("sweep.best_run_id")), None)
    row["best"] = (f"batch {best.data.params.get('batch_size')} {best.data.params.get('precision')}" if best else None)
    row["trials"] = len(kids)
    row["contended"] = sum("sweep.contended" in k.data.tags for k in kids)
    row["other_cores"] = sorted(round(k.data.metrics.get("contention/cpu_other_cores", -1), 2) for k in kids)
    note = parent.data.tags.get("mlflow.note.content", "")
    row["says_contended"] = "rests on contended trials" in note or "measured while other work shared" in note
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweeps", type=int, default=3)
    ap.add_argument("--num-cpus", type=int, default=4)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shared-", dir="/tmp"))
    work = tmp / "work"
    work.mkdir()
    token = tmp / "token"
    token.write_text(secrets.token_hex(32))  # the head's token-auth token (Ray 2.60 turns it on), ours alone
    gcs, dash, mlf, *rest = _ports(12)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "PYTHONPATH": str(REPO),
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    uri = f"http://127.0.0.1:{mlf}"
    names = [f"u{i + 1}" for i in range(args.sweeps)]
    for name in [*names, "alone"]:
        (work / f"{name}.yaml").write_text(SPEC.format(name=name, uri=uri, storage=tmp / "results"))
    head = [str(BIN / "ray"), "start", "--head", "--block", "--num-cpus", str(args.num_cpus), "--node-ip-address",
            "127.0.0.1", "--port", str(gcs), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
            "--include-dashboard", "true", "--ray-client-server-port", str(rest[0]),
            "--dashboard-agent-listen-port", str(rest[1]), "--dashboard-agent-grpc-port", str(rest[2]),
            "--runtime-env-agent-port", str(rest[3]), "--metrics-export-port", str(rest[4]),
            "--node-manager-port", str(rest[5]), "--object-manager-port", str(rest[6]),
            "--min-worker-port", "22000", "--max-worker-port", "22999", "--temp-dir", str(tmp / "ray"),
            "--disable-usage-stats"]
    server = [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}", "--host",
              "127.0.0.1", "--port", str(mlf), "--workers", "1", "--default-artifact-root", str(tmp / "artifacts")]
    from mlflow.tracking import MlflowClient

    address = f"http://127.0.0.1:{dash}"
    with _process(server, env, tmp / "mlflow.log", mlf), _process(head, env, tmp / "head.log", dash):
        subprocess.run([str(BIN / "sweeps"), "wait-head", "--address", address, "--timeout-s", "120"], env=env,
                       check=True)
        jobs = {}
        for name in names:  # within half a second
            jobs[name] = _job(name, address, env, work)
            time.sleep(0.1)
        outs = {name: p.communicate(timeout=1800)[0] for name, p in jobs.items()}
        alone = _job("alone", address, env, work).communicate(timeout=1800)[0]
        client = MlflowClient(uri)
        rows = [_said(name, outs[name], client) for name in names]
        base = _said("alone", alone, client)
    for r in rows:
        r["agrees_with_alone"] = r["best"] == base["best"]
    rows.append(base)
    (tmp / "outputs.txt").write_text("\n\n".join(f"== {n}\n{o}" for n, o in [*outs.items(), ("alone", alone)]))
    head_row = ["sweep", "best", "agrees", "says contended", "contended/trials", "first ETA error %", "waiting lines"]
    print(table(head_row, [[r["sweep"], str(r["best"]), str(r.get("agrees_with_alone", "-")), str(r["says_contended"]),
                            f"{r['contended']}/{r['trials']}", str(r.get("first_eta_error_pct")),
                            str(r["waiting_lines"])] for r in rows]))
    print(f"outputs kept in {tmp / 'outputs.txt'}")
    record("shared_cluster", f"benchmarks/shared_cluster.py --sweeps {args.sweeps} --num-cpus {args.num_cpus}", rows)


if __name__ == "__main__":
    main()
