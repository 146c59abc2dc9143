"""Chapter 1 dataset: committed corpus is the generator's output; per-rank batches shard."""
import pytest
import torch

from course_lib.common.data import (CORPUS_PATH, VOCAB_SIZE, decode, encode, get_batch,
                                    load_corpus, make_corpus)


def test_committed_corpus_is_the_generated_one():
    assert CORPUS_PATH.exists(), "data/corpus.txt is missing: run course_lib.common.data.write_corpus()"
    text = CORPUS_PATH.read_text(encoding="ascii")
    assert text == make_corpus()
    assert 100_000 < len(text) < 300_000


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
