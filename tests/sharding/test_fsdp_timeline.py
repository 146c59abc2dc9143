"""FSDP2's collectives on the timeline (real ranks): the all-gathers and reduce-scatters
``fully_shard`` issues, the same on every rank, each block's forward and backward timed."""
from course_lib.data_parallel.timeline import ddp_timeline
from course_lib.sharding.timeline import fsdp_timeline


def test_fsdp_step_shows_all_gathers_and_reduce_scatters_on_every_rank():
    spans = fsdp_timeline(nprocs=2, warmup=1)
    comm = {r: [s.name.split()[0] for s in spans if s.rank == r and s.lane == "comm"] for r in (0, 1)}
    assert comm[0] == comm[1]
    assert {"all_gather", "reduce_scatter"} <= set(comm[0])
    compute = {s.name for s in spans if s.rank == 0 and s.lane == "compute"}
    assert {"forward block0", "backward block0", "forward block1", "backward block1"} <= compute


def test_ddp_step_shows_a_bucket_issued_before_the_first_layer_is_done():
    spans = ddp_timeline(nprocs=2, warmup=1)
    for r in (0, 1):
        first_layer = next(s for s in spans if s.rank == r and s.name == "backward L0")
        buckets = [s for s in spans if s.rank == r and s.lane == "comm"]
        assert len(buckets) >= 2
        assert buckets[0].t0 < first_layer.t0        # overlap: launched while backward computes
