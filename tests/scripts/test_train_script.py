"""Chapter 12's ``course_lib/scripts/train.py``: on real ranks it equals one process, its check
catches each broken variant with a message that says where to look, and a run killed mid-way
resumes to the uninterrupted run's state bit for bit, alone and under torchrun --max-restarts.

Tolerances: fp32 1e-5 on each printed loss (2 × 2 and 4 ranks sum in another order: 1e-6 seen
over 8 steps, the 6th printed decimal); bf16 ``TOLERANCE_BF16`` (2e-3; 3.6e-4 seen at dp 2 ×
tp 2, the one-process run in bf16 too). Each broken variant is a text substitution in the
script, the mistake a learner makes.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.utils.data import DistributedSampler

from course_lib.capstone.exercises_train import check_train_script, run_learner, verdict
from course_lib.launcher.script_magic import TOLERANCE_BF16, parse_losses, run_script
from course_lib.launcher.torchrun import torchrun

ROOM = Path(__file__).resolve().parents[2] / "course_lib" / "scripts"
KILL = Path(__file__).resolve().with_name("kill_rank.py")
TEXT = (ROOM / "train.py").read_text()
FP32 = 1e-5
RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # pytorch#135712

CLIP = """    norms = [torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if
                                            p.device_mesh.ndim == n]).full_tensor() for n in (1, 2)]
    norm = torch.linalg.vector_norm(torch.stack(norms))"""
# (what the learner got wrong, text replaced, replacement, a phrase of the check's message)
BROKEN = [
    ("no set_epoch", "        sampler.set_epoch(epoch)", "        pass  #", "what tells the sampler"),
    ("clipped by a rank's local norm", CLIP,
     "    norm = torch.nn.utils.get_total_norm([p.grad.to_local() for p in model.parameters()])",
     "which norm you clip by"),
    ("the root left unsharded", 'fully_shard(model, mesh=mesh["dp"], mp_policy=mp)', "pass  #",
     "the root module is not sharded"),
    ("accumulation syncs every micro-step", "model.set_requires_gradient_sync(i == args.accum - 1)",
     "model.set_requires_gradient_sync(True)", "synchronise gradients during accumulation"),
]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(map(str, (ROOM, ROOM.parents[1])))}


def _worst(a: list, b: list) -> float:
    assert len(a) == len(b) == 8, (a, b)
    return max(abs(x - y) for x, y in zip(a, b))


def test_dp2_tp2_passes_the_check_and_equals_one_process_in_fp32():
    output, error, events, reference = run_learner(TEXT)
    assert error is None, error
    losses = parse_losses(output)
    assert _worst(losses, reference) <= FP32, (losses, reference)
    assert losses[-1] < losses[0] - 1.0  # it trained
    feedback = verdict(losses, reference, events, error, output)
    assert feedback.passed, feedback.message


@pytest.mark.parametrize("args,tolerance", [(("--dtype", "fp32"), FP32),  # dp 4
                                            (("--tp", "2"), TOLERANCE_BF16)],  # bf16, dp 2 × tp 2
                         ids=["dp4-fp32", "dp2xtp2-bf16"])
def test_four_ranks_equal_one_process(args, tolerance):
    run = run_script(TEXT, 4, "train.py", args=args, quiet=True)
    assert "dp 4 × tp 1" in run.output or "dp 2 × tp 2" in run.output, run.output[-2000:]
    assert _worst(run.losses, run.reference_losses) <= tolerance, (run.losses, run.reference_losses)


@pytest.mark.parametrize("mistake,old,new,phrase", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_variant_fails_the_check_and_says_where_to_look(mistake, old, new, phrase):
    assert TEXT.count(old) == 1, f"train.py no longer contains {old!r}: update the variant"
    feedback = check_train_script(TEXT.replace(old, new))
    print(f"{mistake}: {feedback.message}")
    assert not feedback.passed and phrase in feedback.message, feedback.message


def test_an_unanswered_check_says_so_without_running():
    assert check_train_script(...).message.startswith("not answered yet")


def _state(folder: Path) -> dict:
    """A DCP checkpoint read back in this process (our own file: DCP unpickles)."""
    dcp_to_torch_save(folder, folder.parent / (folder.name + ".pt"))
    return torch.load(folder.parent / (folder.name + ".pt"), weights_only=False)


def _equal(a, b) -> bool:
    """Bit for bit: every tensor equal in dtype, shape and value; everything else ==."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def _alone(args: list, cwd: Path, kill: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *([str(KILL)] if kill else []), str(ROOM / "train.py"), *args]
    env = {**_env(), **({"COURSE_KILL_AT": kill} if kill else {})}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


RESUME = ["--steps", "8", "--save-every", "4", "--dtype", "fp32"]
BROKEN_RESUME = {"intact": None,  # the data position restarted: a resumed run re-reads epoch 0
                 "data from step 0": ("batches = micro_batches(start)", "batches = micro_batches(0)")}


@pytest.mark.parametrize("variant", BROKEN_RESUME)
def test_a_killed_run_resumes_bit_identical_alone(tmp_path, variant):
    straight = _alone([*RESUME, "--out", "straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-2000:]
    script = ROOM / "train.py"
    if BROKEN_RESUME[variant]:
        old, new = BROKEN_RESUME[variant]
        assert TEXT.count(old) == 1
        (script := tmp_path / "train.py").write_text(TEXT.replace(old, new))
    killed = subprocess.run([sys.executable, str(KILL), str(script), *RESUME, "--out", "killed"],
                            cwd=tmp_path, env={**_env(), "COURSE_KILL_AT": "0:5"},
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert sorted(os.listdir(tmp_path / "killed" / "checkpoint")) == ["step_4"]
    resumed = subprocess.run([sys.executable, str(script), *RESUME, "--out", "killed"],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resumed at step 4" in resumed.stdout, resumed.stderr[-2000:]
    same = _equal(_state(tmp_path / "straight/checkpoint/step_8"),
                  _state(tmp_path / "killed/checkpoint/step_8"))
    curve = parse_losses(killed.stdout + resumed.stdout) == parse_losses(straight.stdout)
    assert (same and curve) == (variant == "intact"), (straight.stdout, resumed.stdout)


def test_torchrun_restarts_a_killed_rank_and_the_run_ends_bit_identical(tmp_path):
    """dp 2 × tp 2 under the real torchrun: rank 1 is SIGKILLed before step 5 of its first attempt;
    torchrun (--max-restarts=1) restarts all four, which resume from step_4: the curve goes on
    as the uninterrupted run's, digit for digit, and step_8 is the same bit for bit."""
    args = [str(ROOM / "train.py"), "--tp", "2", *RESUME]
    env = {**RESTART_ENV, "PYTHONPATH": _env()["PYTHONPATH"]}
    straight = torchrun(str(ROOM / "train.py"), 4, [*args[1:], "--out", str(tmp_path / "a")],
                        timeout=300, quiet=True, env=env)
    killed = torchrun(str(KILL), 4, [*args, "--out", str(tmp_path / "b")], max_restarts=1,
                      timeout=300, quiet=True, env={**env, "COURSE_KILL_AT": "1:5"})
    assert "resumed at step 4: dp 2 × tp 2" in killed.output, killed.output[-3000:]
    assert parse_losses(killed.output) == parse_losses(straight.output)
    assert _equal(_state(tmp_path / "a/checkpoint/step_8"), _state(tmp_path / "b/checkpoint/step_8"))


def _plain_losses(steps=8, accum=2, batch=16, warmup=2, clip=1.0) -> list[float]:
    """The same training in plain PyTorch, one process, no DTensor: the independent reference."""
    from course_lib.scripts import tiny
    model = tiny.model()
    opt = torch.optim.AdamW([{"params": [p for p in model.parameters() if p.dim() >= 2],
                              "weight_decay": 0.1},
                             {"params": [p for p in model.parameters() if p.dim() < 2],
                              "weight_decay": 0.0}], lr=tiny.LR, betas=(0.9, 0.95))
    cosine = lambda s: 0.1 + 0.45 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup)))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else cosine(s))
    data = tiny.dataset()
    sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=0)
    order = []
    for epoch in range(steps * batch // len(data)):
        sampler.set_epoch(epoch)
        order += list(sampler)
    micro, losses = batch // accum, []
    for step in range(steps):
        total = 0.0
        for i in range(accum):
            x, y = data[order[(step * accum + i) * micro:(step * accum + i + 1) * micro]]
            loss = model.loss(model(x), y) / accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        schedule.step()
        opt.zero_grad()
        losses.append(total)
    return losses


def test_one_process_equals_a_plain_pytorch_loop(tmp_path):
    """Alone, train.py still builds a 1 × 1 mesh, DTensors and FSDP2: the plain loop checks that
    they, the schedule, the accumulation and the clipping add nothing."""
    done = _alone(["--dtype", "fp32"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _worst(parse_losses(done.stdout), _plain_losses()) <= FP32


def test_activation_checkpointing_changes_no_loss_and_profile_writes_a_trace(tmp_path):
    """Recomputing in backward what forward dropped gives the same float32 numbers, and it is
    done: the profiled step (--profile's Chrome trace) runs the blocks' GELU again in backward
    (4 calls a step without AC, 8 with full AC, 16 recorded with selective here)."""
    runs = {ac: subprocess.Popen([sys.executable, str(ROOM / "train.py"), "--dtype", "fp32",
                                  "--steps", "3", "--ac", ac, "--profile", "--out", ac],
                                 cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, text=True)
            for ac in ("none", "full", "selective")}
    losses = {ac: parse_losses(proc.communicate(timeout=300)[0]) for ac, proc in runs.items()}
    assert all(proc.returncode == 0 for proc in runs.values())
    assert len(losses["none"]) == 3 and losses["full"] == losses["none"] == losses["selective"]
    gelu = {ac: sum(e.get("name") == "aten::gelu" for e in json.loads(
        (tmp_path / ac / "trace_rank0.json").read_text())["traceEvents"]) for ac in runs}
    assert gelu["none"] > 0 and gelu["full"] > gelu["none"] and gelu["selective"] > gelu["none"], gelu


def test_bad_sizes_stop_before_any_process_group(tmp_path):
    done = _alone(["--batch", "15"], tmp_path)
    assert done.returncode == 1 and "must split into dp × accum = 2 micro-batches" in done.stderr
    assert os.listdir(tmp_path) == []
