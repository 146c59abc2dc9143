"""``Layout``: a parallel layout, parsed and checked once (torchtitan's ``ParallelDims``).

The mesh's named dimensions, outermost first: ``pp`` (pipeline stages), ``dp`` (torch DDP),
``dp_replicate`` × ``dp_shard`` (FSDP2; both: HSDP), ``cp`` (ring attention), ``tp`` (Megatron's
split), ``ep`` (experts). A size of 1 is no dimension. :meth:`Layout.parse` turns a learner's dict
into a ``Layout`` or raises a ``ValueError`` with the reason, before any process starts; every
consumer then reads attributes (``world``, ``dp_size``, ``stage_of``), builds its mesh with
:meth:`Layout.mesh` and asks :meth:`Layout.device_for` where it can run.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from torch.distributed.device_mesh import init_device_mesh

from course_lib.common.checks import is_int
from course_lib.launcher.devices import pipeline_device

__all__ = ["Layout", "MESH_ORDER", "DATA_PARALLEL", "RUNNABLE", "MAX_RANKS", "MOE"]

#: the order of named dimensions in a mesh, outermost first (torchtitan's order)
MESH_ORDER = ("pp", "dp", "dp_replicate", "dp_shard", "cp", "tp", "ep")
#: the dimensions along which ranks read different parts of the global batch
DATA_PARALLEL = ("dp", "dp_replicate", "dp_shard")
#: the combinations ``run_parallel`` runs and checks against one process, and the most ranks
RUNNABLE = {("dp",), ("dp_shard",), ("tp",), ("pp",), ("dp", "tp"), ("dp_shard", "tp"),
            ("dp_replicate", "dp_shard"), ("dp", "pp"), ("dp_shard", "pp"), ("dp", "pp", "tp"),
            ("dp_shard", "pp", "tp"), ("ep",), ("cp",)}
MAX_RANKS = 8
#: the mixture-of-experts layer of the "ep" runs
MOE = {"d_model": 32, "n_experts": 4, "hidden": 64, "top_k": 2}
#: the dimensions of the dense GPT (what ``train_gpt`` trains); ``ep``, ``cp`` run on their own
DENSE = ("pp", "dp", "dp_replicate", "dp_shard", "tp")


def _refusal(names: tuple[str, ...]) -> str | None:
    """Why a combination of dimensions is not run here (``None``: it is)."""
    dims = set(names)
    if "dp" in dims and dims & {"dp_replicate", "dp_shard"}:
        return ("'dp' is torch DDP (the model whole on every rank); with FSDP2's 'dp_shard' "
                "name the replicated dimension 'dp_replicate' (HSDP)")
    if "dp_replicate" in dims and "dp_shard" not in dims:
        return "'dp_replicate' is HSDP's replicated dimension beside 'dp_shard'; alone, use 'dp'"
    for alone in ("ep", "cp"):
        if alone in dims and len(dims) > 1:
            return (f"'{alone}' runs on its own here (chapter 09 runs "
                    f"{'the MoE layer' if alone == 'ep' else 'ring attention'} apart from the GPT)")
    if tuple(sorted(names)) not in RUNNABLE:
        return f"not among the combinations checked here: {sorted(RUNNABLE)}"
    return None


@dataclasses.dataclass(frozen=True)
class Layout:
    """Sizes of the mesh dimensions (1: absent); build one with :meth:`parse`."""

    pp: int = 1
    dp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in MESH_ORDER:
            size = getattr(self, name)
            if not is_int(size) or size < 1:
                raise ValueError(f"size of {name!r} must be a positive integer, got {size!r}")

    @classmethod
    def parse(cls, spec: Layout | Mapping | None, config=None, *, ranks: tuple = (2, MAX_RANKS),
              dims: tuple[str, ...] = MESH_ORDER) -> Layout:
        """The one validator: ``spec`` (a dict such as ``{"dp_shard": 2, "tp": 2}``, ``{}`` or
        ``None`` for one process, or a ``Layout``) checked against the dimensions ``dims``, a
        world size in ``ranks`` (``None``: any), the combinations run here and, with a GPTConfig
        ``config``, the model's heads, layers and sequence; else a ``ValueError`` saying why."""
        if isinstance(spec, Layout):
            spec = spec.sizes()
        if spec is None:
            spec = {}
        if not isinstance(spec, Mapping):
            raise ValueError(f"layout must be a dict of mesh dimension -> size, got {spec!r}")
        for name, size in spec.items():
            if name in MESH_ORDER and name not in dims:
                raise ValueError(f"mesh dimension {name!r} is not one this run takes: {dims}")
            if name not in dims:
                raise ValueError(f"unknown mesh dimension {name!r}; known dimensions: {dims}")
            if not is_int(size) or size < 1:
                raise ValueError(f"layout[{name!r}] must be a positive integer, got {size!r}")
        layout = cls(**spec)
        if ranks is not None and not ranks[0] <= layout.world <= ranks[1]:
            raise ValueError(f"layout {dict(spec)} needs {layout.world} ranks; this runs "
                             f"{ranks[0]} to {ranks[1]} ranks on this machine (a product of "
                             f"sizes in that range)")
        reason = _refusal(layout.names) if ranks is not None and layout.names else None
        if reason:
            raise ValueError(f"layout {dict(spec)}: {reason}")
        if config is not None:
            layout._fits(config, checked=ranks is not None)
        return layout

    def _fits(self, config, checked: bool) -> None:
        if config.n_head % self.tp:
            raise ValueError(f"tp={self.tp} must divide the {config.n_head} attention heads")
        if checked and self.pp not in (1, 2):
            raise ValueError(f"pp={self.pp}: the hand-written pipeline of chapter 09 has 2 stages")
        if checked and config.n_layer % self.pp:
            raise ValueError(f"pp={self.pp} must divide the {config.n_layer} layers")
        if config.seq_len % self.cp:
            raise ValueError(f"cp={self.cp} must divide the sequence length {config.seq_len}")
        if MOE["n_experts"] % self.ep:
            raise ValueError(f"ep={self.ep} must divide the {MOE['n_experts']} experts")

    @property
    def names(self) -> tuple[str, ...]:
        """The mesh's dimension names (sizes above 1), outermost first."""
        return tuple(n for n in MESH_ORDER if getattr(self, n) > 1)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, n) for n in self.names)

    @property
    def world(self) -> int:
        """Ranks the layout needs: the product of its sizes."""
        return math.prod(self.shape)

    @property
    def dp_size(self) -> int:
        """Data-parallel coordinates (each reads its own part of the global batch)."""
        return self.dp * self.dp_replicate * self.dp_shard

    @property
    def dp_names(self) -> tuple[str, ...]:
        return tuple(n for n in DATA_PARALLEL if getattr(self, n) > 1)

    def dp_index(self, mesh) -> int:
        """Inside a rank: its row-major coordinate among the data-parallel ranks of ``mesh``."""
        index = 0
        for n in self.dp_names:
            index = index * getattr(self, n) + mesh.get_local_rank(n)
        return index

    def stage_of(self, rank: int) -> int:
        """The pipeline stage of global ``rank`` (``pp`` is the outermost mesh dimension)."""
        return rank // (self.world // self.pp)

    def sizes(self) -> dict[str, int]:
        """``{name: size}`` of the dimensions, outermost first (``{}``: one process)."""
        return {n: getattr(self, n) for n in self.names}

    def label(self) -> str:
        """``"dp_shard 2 × tp 2"``, or ``"one process"``."""
        return " × ".join(f"{n} {s}" for n, s in self.sizes().items()) or "one process"

    def __str__(self) -> str:
        return str(self.sizes())

    def mesh(self, device: str = "cpu"):
        """Inside a rank: the ``DeviceMesh`` of this layout (``init_device_mesh``)."""
        return init_device_mesh(device, self.shape, mesh_dim_names=self.names)

    def device_for(self, requested: str | None) -> str | None:
        """The device to ask the launcher for: a pipeline's is ``"cpu"`` (``None`` chooses it; a
        GPU is a ``ValueError``); any other layout's is ``requested`` (``None``: the launcher's)."""
        return pipeline_device(requested) if self.pp > 1 else requested  # the launcher's rule
