"""Save or load the tiny GPT's checkpoint in *this* interpreter (one gloo rank), for
``test_cross_python``: ``python cross_python.py save|load FOLDER`` prints one JSON line.

``save`` trains 2 steps and saves ``FOLDER/ckpt/step_000002``; ``load`` loads it with the
course's safe loader. Both print the interpreter, whether its ``pickle`` writes DCP's Enum member
by name (``getattr``, as Python 3.11.2 does), and a digest of the model and optimizer state.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

from course_lib.fault_tolerance.checkpoint import load_checkpoint
from course_lib.fault_tolerance.training import build, train


def _digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    sha = hashlib.sha256()
    tensors = list(model.state_dict().values()) + [
        t for state in optimizer.state.values() for t in state.values()
        if isinstance(t, torch.Tensor)]
    for tensor in tensors:  # the model is FSDP2-sharded (DTensor) once a group exists
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        sha.update(full.detach().contiguous().numpy().tobytes())
    return sha.hexdigest()


def main(action: str, folder: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/.{action}", rank=0,
                            world_size=1)
    try:
        step = folder / "ckpt" / "step_000002"
        if action == "save":
            train("tiny", 2, ckpt_dir=folder / "ckpt", every=2)
        model, optimizer = build("tiny", seed=1)
        load_checkpoint(step, model, optimizer)
        print(json.dumps({
            "python": sys.version.split()[0],
            "by_name": b"getattr" in pickle.dumps(_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT),
            "metadata_by_name": b"getattr" in (step / ".metadata").read_bytes(),
            "digest": _digest(model, optimizer)}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
