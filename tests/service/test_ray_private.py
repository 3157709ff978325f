"""The private Ray names the service reads where Ray has no public one, each pinned here: a Ray release that
moves or renames one fails this file loudly instead of changing what a sweep says without a word."""

from __future__ import annotations

import inspect
from pathlib import Path

from sweeps.service.connect import ray_address_file


def test_the_address_file_ray_start_leaves_is_where_the_service_looks() -> None:
    path = Path(ray_address_file())
    assert path.name == "ray_current_cluster" and path.is_absolute(), path


def test_rays_gpu_type_name_comes_from_its_nvidia_accelerator_manager() -> None:
    # sweeps.service.resources.this_node: `sweeps validate --here` names this machine's GPU as Ray labels it
    from ray._private.accelerators import NvidiaGPUAcceleratorManager

    get = NvidiaGPUAcceleratorManager.get_current_node_accelerator_type
    assert callable(get) and not inspect.signature(get).parameters  # a static method of no argument
    assert NvidiaGPUAcceleratorManager.get_resource_name() == "GPU"


def test_a_placement_groups_id_ends_with_the_id_of_the_job_that_made_it() -> None:
    # sweeps.service.waits.job_groups: Ray's table of placement groups names no group's job; the id does
    import ray

    job = ray.JobID.from_int(7)
    assert ray.PlacementGroupID.of(job).hex().endswith(job.hex()) and len(job.hex()) == 2 * ray.JobID.size()
