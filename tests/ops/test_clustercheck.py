"""Cluster YAMLs: every shipped file passes `sweeps cluster-check`; exposed ones fail it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sweeps.cli import main
from sweeps.ops.clustercheck import check_config, check_file

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "cluster").glob("*.yaml"))


def test_there_are_cluster_files() -> None:
    assert {p.name for p in SHIPPED} >= {"aws.yaml", "gcp.yaml", "onprem.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_cluster_yaml_passes(path: Path) -> None:
    assert check_file(path) == []


def _exposed() -> dict:
    config = yaml.safe_load((REPO / "cluster" / "aws.yaml").read_text())
    config["head_start_ray_commands"] = [
        "ray start --head --port=6379 --dashboard-host=0.0.0.0",
        "nohup mlflow server --host 0.0.0.0 --port 5000 &",
    ]
    config["setup_commands"] = ["pip install gpu-sweeps"]
    config["docker"]["run_options"] = []
    return config


def test_exposed_cluster_yaml_fails_every_check() -> None:
    checks = {f.check for f in check_config(_exposed())}
    assert checks == {"dashboard", "token-auth", "mlflow", "install", "shm"}


def test_schema_errors_name_the_path() -> None:
    config = _exposed()
    config["provider"] = {"type": "aws", "region": "us-west-2", "bogus_key": 1}
    config["max_workers"] = "many"
    schema = [str(f) for f in check_config(config) if f.check == "schema"]
    assert any(s.startswith("[schema] max_workers:") for s in schema), schema


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster-check", *map(str, SHIPPED)]) == 0
    bad = tmp_path / "exposed.yaml"
    bad.write_text(yaml.safe_dump(_exposed()))
    assert main(["cluster-check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "[dashboard] dashboard bound to 0.0.0.0" in out and "[token-auth]" in out
