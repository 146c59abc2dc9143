"""Chapter 1 dataset: the committed corpus is Tiny Shakespeare; per-rank batches shard."""
import hashlib

import pytest
import torch

from course_lib.common import data as data_mod
from course_lib.common.data import (CORPUS_PATH, CORPUS_SHA256, VOCAB_SIZE, corpus_tokens, decode,
                                    encode, get_batch, load_corpus, make_corpus, write_corpus)


def test_committed_corpus_is_tiny_shakespeare():
    raw = CORPUS_PATH.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == CORPUS_SHA256
    assert CORPUS_SHA256 in (CORPUS_PATH.parent / "README.md").read_text()  # source stated
    text = load_corpus()
    assert len(text) == 1_115_394 and text.startswith("First Citizen:\nBefore we proceed")
    assert set(raw) <= set(range(32, 127)) | {10}  # printable ASCII and newlines
    tokens = corpus_tokens()
    assert tokens.dtype == torch.uint8 and torch.equal(tokens.long(), encode(text))
    assert corpus_tokens() is tokens  # read once per process


def test_the_generated_corpus_stays_for_the_finetuning_lab(tmp_path):
    text = make_corpus()
    assert 100_000 < len(text) < 300_000 and text == make_corpus()
    lines = text.splitlines()
    assert any(" + " in ln for ln in lines) and any(" + " not in ln for ln in lines)
    with pytest.warns(DeprecationWarning, match="write_corpus is deprecated"):
        assert write_corpus(tmp_path / "gen.txt").read_text() == text
    before = CORPUS_PATH.read_bytes()
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="is the course corpus"):
        write_corpus()
    assert CORPUS_PATH.read_bytes() == before  # the learner's corpus is never overwritten


def test_a_missing_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="ships in the repository's data/ folder"):
        load_corpus(tmp_path / "none.txt")
    with pytest.raises(FileNotFoundError, match="ships in the repository's data/ folder"):
        data_mod.corpus_tokens(tmp_path / "none.txt")


def test_encode_decode_round_trip():
    text = load_corpus()[:1000]
    ids = encode(text)
    assert ids.dtype == torch.long and int(ids.max()) < VOCAB_SIZE
    assert decode(ids) == text


def test_batches_are_shifted_and_deterministic():
    x, y = get_batch(4, 32, seed=1, step=3)
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    x2, _ = get_batch(4, 32, seed=1, step=3)
    assert torch.equal(x, x2)
    assert not torch.equal(x, get_batch(4, 32, seed=1, step=4)[0])
    assert not torch.equal(x, get_batch(4, 32, seed=2, step=3)[0])
    assert not torch.equal(x, get_batch(4, 32, seed=1, step=3, split="val")[0])


def test_rank_shards_are_distinct_and_concatenate_to_the_global_batch():
    world, b = 4, 3
    shards = [get_batch(b, 16, seed=0, step=5, rank=r, world_size=world) for r in range(world)]
    whole = get_batch(b * world, 16, seed=0, step=5)
    assert torch.equal(torch.cat([s[0] for s in shards]), whole[0])
    assert torch.equal(torch.cat([s[1] for s in shards]), whole[1])
    rows = {tuple(row.tolist()) for s in shards for row in s[0]}
    assert len(rows) == world * b


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch_size=0, seq_len=8), "batch_size must be a positive integer"),
    (dict(batch_size=2, seq_len=8, rank=2, world_size=2), r"rank must be in \[0, world_size=2\)"),
    (dict(batch_size=2, seq_len=8, split="test"), "split must be one of"),
    (dict(batch_size=2, seq_len=10**7), "longer than the train split"),
])
def test_bad_batch_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_batch(seed=0, **kwargs)
