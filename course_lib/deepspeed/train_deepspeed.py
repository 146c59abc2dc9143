"""Train the course GPT with DeepSpeed from a JSON config — as practitioners launch it.

Write the config (chapter 08 prints one: ``course_lib.deepspeed.engine.deepspeed_config(2)``) to
``ds_config.json`` and run ``deepspeed --num_gpus 2 course_lib/deepspeed/train_deepspeed.py
--deepspeed_config ds_config.json``, or the same with ``torchrun --nproc-per-node=2`` in place
of ``deepspeed --num_gpus 2`` (nodes in a hostfile: add ``--hostfile hosts``). The ZeRO stage,
micro-batch and accumulation come from the JSON, the world size from the launcher; it also runs
in ``course_lib.run(main, 2, [...])`` and alone. Rank 0 prints each step's loss; at the end every
rank prints ``losses: [...]`` at full precision (the line chapter 08's test parses). Both
launchers' stores (torchrun's agent's; under ``deepspeed`` rank 0's at ``MASTER_PORT``) have no
authentication and listen on every interface: your own machine or a cluster's private network
only; on a shared machine use ``course_lib.torchrun(...)`` (a private network namespace).
"""
from __future__ import annotations

import argparse
import json
import os
import warnings

import torch
import torch.distributed as dist

from course_lib.common.data import get_batch
from course_lib.deepspeed.load import load_deepspeed
from course_lib.common.models import GPT, get_config
from course_lib.launcher.torchrun import exit_without_finalizing, init_distributed


def join() -> tuple[int, int]:
    """Join the process group under torchrun, ``run``, alone — or the ``deepspeed`` launcher.

    The ``deepspeed`` launcher sets ``MASTER_ADDR``/``MASTER_PORT`` but, unlike torchrun's agent,
    hosts no store there: rank 0 must create it, which ``deepspeed.init_distributed`` does.
    """
    if "MASTER_ADDR" in os.environ and "TORCHELASTIC_RUN_ID" not in os.environ \
            and not dist.is_initialized():
        load_deepspeed().init_distributed(dist_backend="gloo")
        exit_without_finalizing()  # gloo aborts at interpreter shutdown otherwise (00)
        return dist.get_rank(), dist.get_world_size()
    return init_distributed()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed_config", required=True, help="path of the DeepSpeed JSON")
    parser.add_argument("--preset", default="tiny", help="course model preset")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[float]:
    args = parse_args(argv)
    # DeepSpeed 0.19 still calls all_gather_into_tensor / reduce_scatter_tensor: one warning each
    warnings.filterwarnings("ignore", message=".*is deprecated. Please use.*",
                            category=FutureWarning)
    with open(args.deepspeed_config) as f:
        ds_config = json.load(f)
    rank, world = join()
    deepspeed = load_deepspeed()
    config = get_config(args.preset)
    torch.manual_seed(args.seed)
    model = GPT(config)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config)
    micro = engine.train_micro_batch_size_per_gpu()
    losses = []
    for step in range(args.steps):
        inputs, targets = get_batch(micro, args.seq_len, seed=args.seed, step=step, rank=rank,
                                    world_size=world)
        loss = GPT.loss(engine(inputs % config.vocab_size), targets % config.vocab_size)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.4f} (ZeRO stage "
                  f"{engine.zero_optimization_stage()}, world {world})", flush=True)
    dist.barrier()
    print(f"losses: {losses}", flush=True)  # repr of each float: exact, machine-readable
    return losses


if __name__ == "__main__":
    main()
