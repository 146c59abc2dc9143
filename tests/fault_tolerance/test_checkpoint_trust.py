"""Chapter 6's trust boundary: a checkpoint folder is data that cannot reach outside itself.

Each test is an exploit of issue 29 against a copy of a good checkpoint whose manifest the
attacker rewrote too (``ckpt_attacks``): a file outside the folder that must not be read, a
secret whose bytes must not show in an error, a class attribute that must stay unpatched, a
``DeviceMesh`` that must not be built, memory that must not be allocated. Loads run in this
process (world size 1): the reader's checks do not depend on the number of ranks.
"""
from __future__ import annotations

import pathlib

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh

from ckpt_attacks import (append, deflated, error_text, outside_copy, peak_rss_growth,
                          point_item, set_attribute_first, tamper, torch_bytes)
from course_lib.fault_tolerance.checkpoint import CheckpointError, load_checkpoint
from course_lib.fault_tolerance.training import build

LR = "optim.param_groups.0.lr"       # a bytes item (a float saved with torch.save)
EMB = "model.tok_emb.weight"         # a tensor item
MiB = 1 << 20


def _load(ckpt):
    model, optimizer = build("tiny")
    load_checkpoint(ckpt, model, optimizer)
    return model, optimizer


def _refused(ckpt, match: str):
    model, optimizer = build("tiny")
    before = model.tok_emb.weight.detach().clone()
    with pytest.raises(CheckpointError, match=match) as err:
        load_checkpoint(ckpt, model, optimizer)
    assert optimizer.param_groups[0]["lr"] == 1e-3 and torch.equal(model.tok_emb.weight, before)
    return err.value


@pytest.mark.parametrize("where", ["absolute", "dotdot"])
def test_an_item_pointing_outside_the_folder_is_not_read(ckpt, where):
    planted = ckpt.parent / "planted.pt"
    planted.write_bytes(torch_bytes(0.5))  # before the fix, the optimizer's lr became 0.5
    path = str(planted) if where == "absolute" else "../planted.pt"
    point_item(ckpt, LR, relative_path=path, offset=0, length=planted.stat().st_size)
    _refused(ckpt, r"step_000002: \.metadata: item optim\.param_groups\.0\.lr is stored in "
                   r"something that is not a data file of this checkpoint")


@pytest.mark.parametrize("fname", ["__0_0.distcp", ".metadata", "rank0.pt", "manifest.json"])
def test_a_file_replaced_by_a_symlink_is_not_followed(ckpt, fname):
    outside_copy(ckpt, fname)  # same bytes, outside the folder: sizes and checksums still match
    _refused(ckpt, f"step_000002: {fname} is a symbolic link")


def _secret_variants(ckpt, plant):
    """Load ``ckpt`` after ``plant(bytes)`` with two secrets of equal length: both errors."""
    texts = []
    for secret in (bytes(range(65, 91)), bytes(range(97, 123))):  # A-Z, then a-z
        plant(secret)
        model, optimizer = build("tiny")
        with pytest.raises(BaseException) as err:  # DCP's CheckpointException is one
            load_checkpoint(ckpt, model, optimizer)
        texts.append((error_text(err.value), err.type))
    return texts


@pytest.mark.parametrize("where", ["outside", "inside", "metadata"])
def test_errors_never_quote_bytes_of_a_file(ckpt, where):
    secret_file = ckpt.parent / "secret"
    original = (ckpt / "__0_0.distcp").read_bytes()

    def plant(secret):
        if where == "outside":  # another user's readable file, read at an offset
            secret_file.write_bytes(secret)
            point_item(ckpt, LR, relative_path=str(secret_file), offset=5, length=8)
        elif where == "inside":  # bytes inside a listed data file that are no record
            tamper(ckpt, "__0_0.distcp", original)
            point_item(ckpt, LR, offset=append(ckpt, "__0_0.distcp", secret), length=26)
        else:  # a .metadata that is no pickle
            tamper(ckpt, ".metadata", secret)

    (first, kind), (second, _) = _secret_variants(ckpt, plant)
    assert first == second, "the error text depends on the bytes of the file"
    assert issubclass(kind, CheckpointError), first[-600:]


@pytest.mark.parametrize("module, name", [("pathlib", "PosixPath"),
                                          ("torch.serialization", "_get_layout")])
def test_metadata_cannot_set_attributes_of_a_class_or_function(ckpt, module, name):
    target = pathlib.PosixPath if name == "PosixPath" else torch.serialization._get_layout
    set_attribute_first(ckpt, module, name, "_course_probe")
    try:
        _refused(ckpt, rf"step_000002: refusing to load: \.metadata sets attributes of "
                       rf"{module}\.{name}")
        assert not hasattr(target, "_course_probe"), "the load patched a class or function"
    finally:
        if "_course_probe" in vars(target):
            delattr(target, "_course_probe")


def test_only_plain_data_loads_where_plain_data_was_saved(ckpt, monkeypatch):
    built = []
    monkeypatch.setattr(DeviceMesh, "__setstate__", lambda self, state: built.append(state),
                        raising=False)
    mesh = DeviceMesh.__new__(DeviceMesh)
    mesh.__dict__.update(device_type="cpu")  # allowed by torch.load(weights_only=True)
    blob = torch_bytes(mesh)
    point_item(ckpt, LR, offset=append(ckpt, "__0_0.distcp", blob), length=len(blob))
    _refused(ckpt, r"item optim\.param_groups\.0\.lr: a bytes item holds something other "
                   r"than plain data")
    assert not built, "a DeviceMesh was unpickled where a float was saved"


def test_a_compressed_record_is_refused_before_it_is_inflated(ckpt):
    big = torch.zeros(64 * MiB // 4)  # 64 MiB of zeros behind a view of the right shape
    blob = deflated(torch_bytes(big[: 256 * 64].view(256, 64)))
    assert len(blob) < MiB
    point_item(ckpt, EMB, offset=append(ckpt, "__0_0.distcp", blob), length=len(blob))
    grew = peak_rss_growth(lambda: _load(ckpt))
    assert grew is None or grew < 32 * MiB, f"the record was inflated: +{grew / MiB:.0f} MiB"
    _refused(ckpt, r"item model\.tok_emb\.weight: a compressed record in __0_0\.distcp")


@pytest.mark.parametrize("where", ["dev_zero", "past_the_end"])
def test_an_item_larger_than_its_file_is_refused_before_reading(ckpt, where):
    size = (ckpt / "__0_0.distcp").stat().st_size
    if where == "dev_zero":  # an endless file: 128 MiB read before the fix
        point_item(ckpt, LR, relative_path="/dev/zero", offset=0, length=128 * MiB)
        match = "not a data file of this checkpoint"
    else:
        point_item(ckpt, LR, offset=size - 10, length=1 << 40)
        match = rf"item optim\.param_groups\.0\.lr: bytes {size - 10}-\d+ are past the end " \
                rf"of __0_0\.distcp \({size} bytes\)"
    grew = peak_rss_growth(lambda: _load(ckpt))
    assert grew is None or grew < 32 * MiB, f"+{grew / MiB:.0f} MiB read"
    _refused(ckpt, match)


def test_an_oversized_metadata_is_refused_unread(ckpt):
    # 17 MiB of bytes pushed and popped, then the real pickle: loads before the fix; a pickle
    # of that size could hold ~1 GB of small objects
    pad = 17 * MiB
    tamper(ckpt, ".metadata", b"B" + pad.to_bytes(4, "little") + bytes(pad) + b"0"
           + (ckpt / ".metadata").read_bytes())
    _refused(ckpt, r"step_000002: \.metadata is larger than 16777216 bytes")


def test_a_transformed_record_is_refused(ckpt):
    point_item(ckpt, EMB, transform_descriptors=["stream.zstd"])  # DCP's zstd extension
    _refused(ckpt, r"item model\.tok_emb\.weight is stored through a transform")


def test_the_good_checkpoint_still_loads(ckpt):
    model, optimizer = _load(ckpt)
    assert optimizer.state and optimizer.param_groups[0]["lr"] == 1e-3
