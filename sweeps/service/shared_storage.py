"""Whether every node of the cluster sees the sweep's `storage_path`, asked before the first trial.

Each rank writes its trace and a warm trial's checkpoint under `storage_path` on the node it runs on, and the
sweep's driver reads them back on its own; on nodes that share no disk those files stayed on the worker
nodes and the sweep said nothing. So on a cluster this process joined (not a local instance it started) the
driver writes a marker under `storage_path` and asks one task on every live node whether it reads the same
marker there; the nodes that do not are named in one line (exit 5), before any trial runs.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from sweeps.exits import EnvironmentProblem, StorageProblem
from trainables.storage import Storage, StorageError

ASK_TIMEOUT_S = 60.0  # a task per node: a node too busy to start a zero-CPU task in this long is reported as such
_MARKER = ".sweeps-visible-{token}"


def _reads(path: str, token: str) -> str:
    """On a node: "" when `path` holds `token`, else what it found (runs as a Ray task)."""
    try:
        with open(path) as f:
            return "" if f.read() == token else "another file there"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def node_name(node: dict[str, Any]) -> str:
    """A node as a user finds it: its address, its name where Ray has another, and its id's start."""
    address, name = node.get("NodeManagerAddress", "?"), node.get("NodeName")
    named = f"{address}, {name}" if name and name != address else str(address)
    return f"{named} (node {str(node.get('NodeID', ''))[:8]})"


def unseen_by(root: Path, nodes: list[dict[str, Any]], timeout_s: float = ASK_TIMEOUT_S) -> dict[str, str]:
    """Ask each node whether it sees `root`: {node id: why not} for those that do not."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = uuid.uuid4().hex
    marker = root / _MARKER.format(token=token)
    marker.write_text(token)
    try:
        ask = ray.remote(num_cpus=0, max_retries=0)(_reads)
        asked = {}
        for n in nodes:
            on_node = ask.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            asked[n["NodeID"]] = on_node.remote(str(marker), token)
        ready, _ = ray.wait(list(asked.values()), num_returns=len(asked), timeout=timeout_s)
        unseen = {}
        for node_id, ref in asked.items():
            if ref not in ready:
                unseen[node_id] = f"no answer in {timeout_s:.0f} s"
                ray.cancel(ref, force=True)
            elif why := ray.get(ref):
                unseen[node_id] = why
        return unseen
    finally:
        marker.unlink(missing_ok=True)


def working_nodes() -> list[dict[str, Any]]:
    """The live nodes a rank can run on (CPUs or GPUs): a zero-CPU head runs none."""
    import ray

    return [n for n in ray.nodes() if n.get("Alive") and (n.get("Resources", {}).get("CPU", 0) > 0
                                                         or n.get("Resources", {}).get("GPU", 0) > 0)]


def refuse_unshared_storage(root: Path) -> None:
    """Refuse, in one line naming `storage_path` and the nodes, a storage folder some live node cannot see."""
    nodes = working_nodes()
    unseen = unseen_by(root.resolve(), nodes)
    if unseen:
        names = {n["NodeID"]: node_name(n) for n in nodes}
        listed = "; ".join(sorted(f"{names[node_id]}: {why}" for node_id, why in unseen.items()))
        raise EnvironmentProblem(
            f"storage_path {os.fspath(root)} is not visible from {len(unseen)} of {len(nodes)} nodes ({listed}): "
            "each rank writes its trace and checkpoints there on its own node, and the sweep reads them back. Give "
            "a storage_path every node mounts at the same path (NFS, EFS, Filestore, a Kubernetes volume)")


def storage_here(storage_path: str) -> str:
    """What `sweeps validate --here` says of `storage_path`, found as a `sweeps run` from here would find it.

    A URI: written to from here (the nodes write with their own credentials). A local folder on the Ray cluster a
    run here would join (RAY_ADDRESS, or the one `ray start` left): every node is asked whether it sees it, and
    the refusal is `sweeps run`'s own (exit 5). Without a cluster a local run has one node: nothing to ask."""
    from sweeps.service.connect import connect_ray, ray_address

    try:
        st = Storage(storage_path)
        if not st.is_local:
            st.check_writable()
            return f"; storage_path {storage_path} is writable from here"
    except StorageError as exc:
        raise StorageProblem(str(exc)) from None
    address, _ = ray_address()
    if address is None:
        return ""
    import ray

    root = Path(st.uri())
    root.mkdir(parents=True, exist_ok=True)
    connect_ray(lambda _: None, lambda _: None)
    try:
        nodes = len(working_nodes())
        refuse_unshared_storage(root)
    finally:
        ray.shutdown()
    return f"; all {nodes} nodes of the Ray cluster at {address} see storage_path {root}"
