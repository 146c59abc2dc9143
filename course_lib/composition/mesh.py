"""DeviceMesh, taught: the same ranks viewed as 1-D and 2-D meshes, and the groups they make.

A mesh is an n-dimensional array of ranks with named dimensions; ``mesh["tp"]`` is the 1-D
sub-mesh along one dimension that contains the calling rank, and ``mesh.get_group("tp")`` the
process group a collective along that dimension uses. :func:`mesh_groups` runs inside a rank and
reports what it sees; :func:`show_meshes` runs it on real ranks.
"""
from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from course_lib.launcher.launch import run

__all__ = ["mesh_groups", "show_meshes", "format_meshes"]


def mesh_groups(shape: tuple[int, ...], names: tuple[str, ...]) -> dict:
    """Inside a rank: build ``init_device_mesh("cpu", shape, mesh_dim_names=names)`` and return,
    per dimension, this rank's coordinate and the ranks of its process group along it (read from
    the group itself, ``dist.get_process_group_ranks``), plus one all_reduce per dimension whose
    result (the sum of the group's global ranks) proves the group is real."""
    import torch
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    out = {"rank": dist.get_rank(), "mesh": mesh.mesh.tolist(), "dims": {}}
    for name in names:
        group = mesh.get_group(name)
        total = torch.tensor(float(dist.get_rank()))
        dist.all_reduce(total, group=group)
        out["dims"][name] = {"coordinate": mesh.get_local_rank(name),
                             "group_ranks": dist.get_process_group_ranks(group),
                             "sub_mesh": mesh[name].mesh.tolist(),
                             "all_reduce_of_ranks": int(total.item())}
    return out


def _all_meshes(layouts: dict) -> dict[str, dict]:
    """Inside a rank: :func:`mesh_groups` for each ``{label: (shape, names)}``, one after another."""
    return {label: mesh_groups(shape, names) for label, (shape, names) in layouts.items()}


def show_meshes(world: int = 4, layouts: dict | None = None) -> dict[str, list[dict]]:
    """Run :func:`mesh_groups` on ``world`` real ranks for each ``{label: (shape, names)}``
    (one launch: the same ranks build every mesh in turn)."""
    layouts = layouts or {"1-D": ((world,), ("dp",)),
                          "2-D": ((2, world // 2), ("dp", "tp"))}
    per_rank = run(_all_meshes, world, layouts)
    return {label: [r[label] for r in per_rank] for label in layouts}


def format_meshes(result: dict[str, list[dict]]) -> str:
    """One line per rank and dimension: the ranks it talks to along that dimension."""
    lines = []
    for label, ranks in result.items():
        lines.append(f"{label} mesh {ranks[0]['mesh']}")
        for r in ranks:
            parts = [f"{name}[{d['coordinate']}] group {d['group_ranks']} "
                     f"(all_reduce of ranks = {d['all_reduce_of_ranks']})"
                     for name, d in r["dims"].items()]
            lines.append(f"  rank {r['rank']}: " + "; ".join(parts))
    return "\n".join(lines)
