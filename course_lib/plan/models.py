"""The model a planner plans: a Hugging Face ``config.json`` read with transformers' ``AutoConfig``.

:func:`load_config` takes a stored name (``data/models/NAME/config.json``: Llama 3.1 8B/70B/405B,
Mistral 7B, Mixtral 8x7B, Qwen2.5 7B), a learner's ``config.json`` (file or folder) or a dict,
offline and without remote code. :func:`model_spec` checks the fields the planner reads and
raises :class:`ConfigError` naming the field (not a traceback from deep inside a model class).
:func:`build_stage` builds the model with transformers' own class for that ``model_type``
(``AutoModelForCausalLM.from_config``: the code people train), at a chosen depth, on whatever
``FakeTensorMode`` is active, and cuts it into a pipeline stage (torchtitan's split: the first
stage keeps the embedding, the last the final norm and ``lm_head``). transformers is imported
here only, when a config is read: the planner's other modules stay light.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["MODELS_DIR", "STORED", "ConfigError", "ModelSpec", "load_config", "model_spec",
           "build_stage", "unpacked_rows"]

MODELS_DIR = Path(__file__).resolve().parents[2] / "data" / "models"
#: the stored configs, by folder name
STORED = tuple(sorted(p.parent.name for p in MODELS_DIR.glob("*/config.json")))
_INTS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


class ConfigError(ValueError):
    """A config the planner cannot build; the message names the field."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The numbers of a config the planner reads (checked by :func:`model_spec`)."""

    name: str
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    experts: int = 1        # routed experts per MoE layer (1: dense)
    top_k: int = 1          # experts per token
    tied: bool = False

    @property
    def moe(self) -> bool:
        return self.experts > 1


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the network: configs are files here
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers
    return transformers


def load_config(source: Any):
    """A transformers ``PretrainedConfig`` from a stored name, a path or a dict (no remote code)."""
    tf = _transformers()
    if isinstance(source, tf.PretrainedConfig):
        return copy.deepcopy(source)
    if isinstance(source, dict):
        data = dict(source)
    else:
        path = Path(str(source))
        if not path.exists() and (MODELS_DIR / str(source) / "config.json").is_file():
            path = MODELS_DIR / str(source)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"no config at {source!r}: give a stored name ({', '.join(STORED)}), "
                              "a config.json file or a folder holding one")
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConfigError(f"{path.name}: not readable JSON ({err})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path.name}: a config.json holds one JSON object")
        data.setdefault("_name_or_path", path.parent.name if path.name == "config.json" else path.stem)
    if "auto_map" in data:
        raise ConfigError("field 'auto_map': this config asks for the model's own remote code; "
                          "the planner runs only transformers' built-in classes")
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in tf.CONFIG_MAPPING:
        raise ConfigError(f"field 'model_type' is {model_type!r}: not a model type this "
                          f"transformers ({tf.__version__}) knows")
    name = data.pop("_name_or_path", "model")
    try:
        config = tf.AutoConfig.for_model(**data)
    except Exception as err:  # transformers' own validation, named
        raise ConfigError("transformers refused the config: " + " ".join(str(err).split())) from None
    config._name_or_path = name
    return config


def _field(config, name: str, default: Any = None) -> Any:
    value = getattr(config, name, default)
    return default if value is None else value


def model_spec(config) -> ModelSpec:
    """Check the fields the planner reads and return them; :class:`ConfigError` names a bad one."""
    tf = _transformers()
    if not isinstance(config, tf.PretrainedConfig):
        config = load_config(config)
    values = {}
    for key in _INTS:
        v = getattr(config, key, None)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ConfigError(f"field {key!r} must be a positive integer, got {v!r} "
                              f"(model_type {config.model_type!r})")
        values[key] = v
    heads = values["num_attention_heads"]
    kv = _field(config, "num_key_value_heads", heads)
    if not isinstance(kv, int) or kv <= 0 or heads % kv:
        raise ConfigError(f"field 'num_key_value_heads' ({kv!r}) must divide "
                          f"'num_attention_heads' ({heads})")
    head_dim = _field(config, "head_dim", None)
    if head_dim is None:
        if values["hidden_size"] % heads:
            raise ConfigError(f"field 'hidden_size' ({values['hidden_size']}) is not a multiple of "
                              f"'num_attention_heads' ({heads}) and no 'head_dim' is given")
        head_dim = values["hidden_size"] // heads
    experts = _field(config, "num_local_experts", _field(config, "num_experts", 1))
    top_k = _field(config, "num_experts_per_tok", 1)
    if experts > 1 and not 1 <= top_k <= experts:
        raise ConfigError(f"field 'num_experts_per_tok' ({top_k!r}) must be between 1 and the "
                          f"number of experts ({experts})")
    return ModelSpec(name=str(getattr(config, "_name_or_path", "") or config.model_type),
                     model_type=config.model_type, layers=values["num_hidden_layers"],
                     hidden=values["hidden_size"], heads=heads, kv_heads=kv, head_dim=head_dim,
                     ffn=values["intermediate_size"], vocab=values["vocab_size"],
                     experts=experts if experts > 1 else 1, top_k=top_k if experts > 1 else 1,
                     tied=bool(getattr(config, "tie_word_embeddings", False)))


def build_stage(config, depth: int, *, first: bool = True, last: bool = True, experts: int | None = None,
                seq_len: int | None = None):
    """transformers' model for ``config`` with ``depth`` layers, cut to one pipeline stage.

    ``experts``: the experts this rank holds (expert parallelism: ``experts / ep``). A sliding
    window no shorter than ``seq_len`` is dropped (the same causal attention, without a mask).
    Call under ``FakeTensorMode``; the parameters are created in fp32 (the master weights).
    """
    tf = _transformers()
    config = copy.deepcopy(config)
    config.num_hidden_layers = depth
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types)[:depth]
    if seq_len and (getattr(config, "sliding_window", None) or 0) >= seq_len:
        config.sliding_window = None
    if experts is not None:
        for key in ("num_local_experts", "num_experts"):
            if getattr(config, key, None):
                setattr(config, key, experts)
    config.use_cache = False
    import torch
    # fp32 master weights whatever the checkpoint's dtype (configs say "torch_dtype": "bfloat16")
    kwargs = {"attn_implementation": "sdpa", "dtype": torch.float32}
    if model_spec(config).moe:
        kwargs["experts_implementation"] = "grouped_mm"
    try:
        model = tf.AutoModelForCausalLM.from_config(config, **kwargs)
    except (TypeError, ValueError):
        kwargs.pop("experts_implementation", None)
        model = tf.AutoModelForCausalLM.from_config(config, **kwargs)
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "layers"):
        raise ConfigError(f"field 'model_type' {config.model_type!r}: its transformers class has "
                          "no `model.layers` list of decoder blocks, which the planner splits")
    if not first:
        body.embed_tokens = None
    if not last:
        import torch.nn as nn
        body.norm = nn.Identity()
        model.lm_head = nn.Identity()  # the stage's output is the hidden state it sends on
    model.train()
    return model


@contextlib.contextmanager
def unpacked_rows():
    """Inside: transformers takes each row of a batch for one sequence, as it finds on real tensors.

    With no attention mask, transformers reads the position ids to see whether a row packs several
    sequences (``masking_utils.find_packed_sequence_indices``). It cannot read a fake tensor, so
    it assumes packing: it builds a (batch, 1, S, S) mask, and with a mask its SDPA call repeats
    K and V to every query head instead of using the grouped-query kernel. Measured against real
    CPU ranks (tests/plan/test_real_llama.py), that made the fake step +5.9 % (FSDP 4) to +8.0 %
    (FSDP 4, full checkpointing) too high. The planner's rows are one sequence each.
    """
    _transformers()
    from transformers import masking_utils
    find = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = find
