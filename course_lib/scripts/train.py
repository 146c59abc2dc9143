"""Train the course GPT as people do at work: FSDP2 × tensor parallelism on a named 2-D mesh, bf16
mixed precision, activation checkpointing, AdamW with warmup and cosine decay, gradient
accumulation, clipping, checkpoints it resumes from, and a log of loss, tokens/s and MFU.

    torchrun --standalone --nproc-per-node=4 course_lib/scripts/train.py --dp 2 --tp 2
    python course_lib/scripts/train.py        # one process: the reference (dp = tp = 1)

Run it again with the same --out and it resumes from the newest complete checkpoint there
(load only checkpoints you wrote: dcp.load unpickles what it reads). --profile writes a trace of
one step to OUT/trace_rank0.json (open it in chrome://tracing or https://ui.perfetto.dev).
"""
import argparse
import math
import os
import re
import sys
import time
from itertools import islice

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from torch.utils.data import DataLoader, DistributedSampler

import tiny  # the model and data, the file beside this one

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--dp", type=int, default=0, help="data-parallel size (default: ranks / tp)")
parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (adjacent ranks)")
parser.add_argument("--steps", type=int, default=tiny.STEPS)
parser.add_argument("--batch", type=int, default=tiny.GLOBAL_BATCH, help="windows a step (all)")
parser.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
parser.add_argument("--lr", type=float, default=tiny.LR)
parser.add_argument("--warmup", type=int, default=2, help="steps of linear warmup")
parser.add_argument("--clip", type=float, default=1.0, help="max global gradient norm")
parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="compute dtype")
parser.add_argument("--ac", choices=["none", "full", "selective"], default="none")
parser.add_argument("--compile", action="store_true", help="torch.compile each block")
parser.add_argument("--profile", action="store_true", help="trace one step")
parser.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0: never)")
parser.add_argument("--out", default="outputs/train", help="checkpoints and traces go here")
parser.add_argument("--peak-flops", type=float, default=1e11,
                    help="peak FLOP/s of one rank, for MFU (default 1e11: about one CPU core)")
args = parser.parse_args()
world = int(os.environ.get("WORLD_SIZE", 1))
tp = args.tp if world > 1 else 1  # alone: the one-process reference
dp = (args.dp or world // tp) if world > 1 else 1
if dp * tp != world or args.batch % (dp * args.accum):  # bad input: stop before joining
    sys.exit(f"--dp {dp} × --tp {tp} must be the {world} ranks, and --batch {args.batch} "
             f"must split into dp × accum = {dp * args.accum} micro-batches")

device = tiny.device()  # cuda:LOCAL_RANK with a GPU, else the CPU
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **tiny.alone())
rank = dist.get_rank()
mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))

# The model: TP inside each block, activation checkpointing, compile, then FSDP2 over dp
model = tiny.group_heads(tiny.model(), tp).to(device)  # qkv rows: rank r's heads together
cfg = model.config
matmul_params = sum(p.numel() for n, p in model.named_parameters() if "emb" not in n)
flops_per_token = 6 * matmul_params + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * cfg.seq_len
SAVE = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,  # selective AC keeps these
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops.aten._scaled_dot_product_flash_attention.default}


def keep_matmuls():  # selective AC: save matmul outputs, recompute the cheap ops between them
    return create_selective_checkpoint_contexts(
        lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE if op in SAVE
        else CheckpointPolicy.PREFER_RECOMPUTE)


mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32,
                          reduce_dtype=torch.float32)
for i, block in enumerate(model.blocks):
    parallelize_module(block, mesh["tp"], {"attn.qkv": ColwiseParallel(),
                                           "attn.proj": RowwiseParallel(),
                                           "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()})
    if args.ac == "full":  # keep only the block's input; recompute its inside in backward
        block = checkpoint_wrapper(block, preserve_rng_state=False)
    elif args.ac == "selective":  # ... all but the matmuls' outputs
        block = checkpoint_wrapper(block, preserve_rng_state=False, context_fn=keep_matmuls)
    if args.compile:
        block = torch.compile(block)
    fully_shard(block, mesh=mesh["dp"], mp_policy=mp)  # one all-gather / reduce-scatter per block
    model.blocks[i] = block
fully_shard(model, mesh=mesh["dp"], mp_policy=mp)  # the root: embeddings, final norm, head

decay = [p for p in model.parameters() if p.dim() >= 2]  # weight decay on matrices only
rest = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": rest, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))


def lr_factor(step):  # linear warmup, then cosine decay to a tenth of the peak
    if step < args.warmup:
        return (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)

# The data: each dp rank its share of every global batch, in micro-batches; a TP pair the same
data = tiny.dataset()
sampler = DistributedSampler(data, num_replicas=dp, rank=mesh["dp"].get_local_rank(), seed=0)
loader = DataLoader(data, batch_size=args.batch // (dp * args.accum), sampler=sampler,
                    drop_last=True)


def micro_batches(step):  # this rank's micro-batches from optimizer step `step` on
    epoch, skip = divmod(step * args.accum, len(loader))
    while True:
        sampler.set_epoch(epoch)  # another order each epoch, the same on every rank
        for x, y in islice(loader, skip, None):
            yield x.to(device), y.to(device)
        epoch, skip = epoch + 1, 0


# Checkpoints: DCP writes each into a fresh step_N.tmp; renamed to step_N once complete
folder = os.path.join(args.out, "checkpoint")


def state():
    model_state, optim_state = get_state_dict(model, opt)
    return {"model": model_state, "optim": optim_state, "scheduler": scheduler.state_dict(),
            "tp": tp}


committed = [int(m[1]) for d in (os.listdir(folder) if os.path.isdir(folder) else [])
             if (m := re.fullmatch(r"step_(\d+)", d))]
start = max(committed, default=0)
if start:  # resume: weights, optimizer, schedule; the step gives the data position
    loaded = state()
    dcp.load(loaded, checkpoint_id=os.path.join(folder, f"step_{start}"))
    if loaded["tp"] != tp:  # group_heads ordered its qkv rows for that tp
        sys.exit(f"{folder} holds a run with --tp {loaded['tp']}: resume it with that --tp")
    set_state_dict(model, opt, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    scheduler.load_state_dict(loaded["scheduler"])
if rank == 0:
    print(f"{'resumed at step ' + str(start) if start else 'started'}: dp {dp} × tp {tp}, "
          f"{flops_per_token:,} FLOPs/token, MFU against {args.peak_flops:.1e} FLOP/s per rank")

batches = micro_batches(start)
tokens = args.batch * cfg.seq_len  # per optimizer step, all ranks
for step in range(start, args.steps):
    prof = torch.profiler.profile() if args.profile and step == start + 1 else None  # warmed up
    if prof:
        prof.start()
    t0 = time.perf_counter()
    loss = torch.zeros((), device=device)
    for i in range(args.accum):
        x, y = next(batches)
        model.set_requires_gradient_sync(i == args.accum - 1)  # reduce-scatter once, at the end
        micro = model.loss(model(x), y) / args.accum
        micro.backward()
        loss += micro.detach()
    # Clip to the norm of the whole gradient, all shards: DTensor reduces over each mesh. (One
    # clip_grad_norm_ call would mix two meshes, which DTensor refuses: blocks dp × tp, root dp.)
    norms = [torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if
                                            p.device_mesh.ndim == n]).full_tensor() for n in (1, 2)]
    norm = torch.linalg.vector_norm(torch.stack(norms))
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), args.clip, norm, foreach=False)
    lr = scheduler.get_last_lr()[0]  # this step's
    opt.step()
    scheduler.step()
    opt.zero_grad()
    dist.all_reduce(loss)  # every rank of a TP pair holds its dp rank's loss: mean over all
    seconds = time.perf_counter() - t0
    if prof:
        prof.stop()
        os.makedirs(args.out, exist_ok=True)
        prof.export_chrome_trace(os.path.join(args.out, f"trace_rank{rank}.json"))
    if rank == 0:
        mfu = tokens / seconds * flops_per_token / (world * args.peak_flops)
        print(f"step {step} loss {loss.item() / world:.6f} | lr {lr:.2e} "
              f"| norm {norm.item():.3f} | {seconds * 1000:.0f} ms, "
              f"{tokens / seconds:,.0f} tokens/s, MFU {mfu:.1%}", flush=True)
    if args.save_every and (step + 1) % args.save_every == 0:
        path = os.path.join(folder, f"step_{step + 1}")
        dcp.save(state(), checkpoint_id=path + ".tmp")  # returns once every rank has written
        if rank == 0:
            os.rename(path + ".tmp", path)  # committed: a resume may now use it

dist.destroy_process_group()
# On the CPU, gloo's threads can abort Python's own shutdown after every line ran ("terminate
# called without an active exception"), which torchrun reports as a failed rank: end here instead.
sys.stdout.flush()
os._exit(0)
