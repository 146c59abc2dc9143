"""The capstone's data: the course corpus (Tiny Shakespeare), byte tokens, a train/validation
split, and torch's ``DistributedSampler`` deciding which windows each data-parallel rank reads,
in which order.

The training split is cut into non-overlapping windows of ``seq_len + 1`` bytes. Epoch ``e`` is
the permutation ``DistributedSampler(shuffle=True, seed, drop_last=True)`` draws after
``set_epoch(e)``; data-parallel rank ``r`` of ``n`` reads every n-th index from ``r`` on, so
global batch ``k`` is the same set of windows for every ``n`` (one process reads them all):
the property that lets curves of different layouts coincide. The position (epoch, batch in the
epoch) is a small dict saved with each checkpoint, so a resumed run reads what comes next.
"""
from __future__ import annotations

import torch
from torch.utils.data import Dataset, DistributedSampler

from course_lib.common.data import corpus_tokens

__all__ = ["VAL_FRACTION", "split_corpus", "Windows", "DataOrder", "val_batch"]

VAL_FRACTION = 0.1  # the last 10 % of the corpus: never trained on


def split_corpus() -> tuple[torch.Tensor, torch.Tensor]:
    """The corpus's byte tokens, cut into (train, val) at 90 %: uint8 views of the one copy this
    process read (1 byte per token; :class:`Windows` hands out int64 ids, as an embedding takes)."""
    data = corpus_tokens()
    cut = int(len(data) * (1 - VAL_FRACTION))
    return data[:cut], data[cut:]


class Windows(Dataset):
    """Non-overlapping ``(inputs, targets)`` windows of ``seq_len`` tokens (targets shifted by 1)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        self.tokens, self.seq_len = tokens, seq_len
        self.n = (len(tokens) - 1) // seq_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.tokens[i * self.seq_len:(i + 1) * self.seq_len + 1].long()
        return w[:-1], w[1:]


class DataOrder:
    """This data-parallel rank's batches, epoch after epoch, with a position to save and restore.

    ``batch_size`` is per rank; an epoch has ``len(windows) // (batch_size * dp_size)`` global
    batches (the rest is dropped, so every layout sees the same batches)."""

    def __init__(self, windows: Windows, batch_size: int, dp_index: int, dp_size: int,
                 seed: int) -> None:
        self.windows, self.batch_size = windows, batch_size
        self.sampler = DistributedSampler(windows, num_replicas=dp_size, rank=dp_index,
                                          shuffle=True, seed=seed, drop_last=True)
        self.per_epoch = len(windows) // (batch_size * dp_size)
        if self.per_epoch < 1:
            raise ValueError(f"{len(windows)} windows cannot fill one global batch of "
                             f"{batch_size * dp_size}: use a smaller batch")
        self.epoch, self.position, self._indices = 0, 0, None

    def state(self) -> dict:
        """Where the next batch comes from (JSON: it goes into the checkpoint's manifest)."""
        return {"epoch": self.epoch, "position": self.position}

    def restore(self, state: dict) -> None:
        epoch, position = state["epoch"], state["position"]
        if not (type(epoch) is int and type(position) is int and epoch >= 0
                and 0 <= position < self.per_epoch):
            raise ValueError(f"data position {state!r} is outside this data set")
        self.epoch, self.position, self._indices = epoch, position, None

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._indices is None:
            self.sampler.set_epoch(self.epoch)
            self._indices = list(self.sampler)
        mine = self._indices[self.position * self.batch_size:(self.position + 1) * self.batch_size]
        self.position += 1
        if self.position == self.per_epoch:
            self.epoch, self.position, self._indices = self.epoch + 1, 0, None
        x, y = zip(*(self.windows[i] for i in mine))
        return torch.stack(x), torch.stack(y)


def val_batch(tokens: torch.Tensor, seq_len: int, sequences: int, dp_index: int = 0,
              dp_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of the fixed validation batch: the first ``sequences`` windows of the
    validation split, every ``dp_size``-th from ``dp_index`` on."""
    windows = Windows(tokens, seq_len)
    if sequences > len(windows):
        raise ValueError(f"the validation split holds {len(windows)} windows, not {sequences}")
    x, y = zip(*(windows[i] for i in range(dp_index, sequences, dp_size)))
    return torch.stack(x), torch.stack(y)
