"""The DeepSpeed training loop: ``deepspeed.initialize``, then ``engine.backward`` / ``engine.step``.

Chapter 08 types :func:`train_deepspeed` in an editable cell (metadata ``library_copy``; the test
``tests/test_cell_library_identity.py`` keeps the two identical) and ships the *cell's* function
to the ranks: :func:`course_lib.deepspeed.engine.run_zero_stages` (``train=``) calls it once per
ZeRO stage inside every rank, so a learner's edit changes what the ranks run. Inside the ranks
DeepSpeed is already imported, by :func:`course_lib.deepspeed.load.load_deepspeed`.
"""
from __future__ import annotations

import torch.nn.functional as F

__all__ = ["train_deepspeed"]


def train_deepspeed(model, ds_config, batches, after_backward=None):
    """Train ``model`` on this rank under the DeepSpeed config ``ds_config``; ``(engine, losses)``.

    The engine owns the ZeRO optimizer: ``engine.backward`` averages the gradients over the
    ranks (stage 0: all-reduce; 1-3: reduce-scatter into each rank's partition) and
    ``engine.step`` runs Adam on this rank's partition, then all-gathers the parameters — only
    at the end of ``gradient_accumulation_steps`` micro-batches. ``after_backward(engine)``
    runs after every backward (the chapter counts the bytes there).
    """
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config)
    losses = []
    for inputs, targets in batches:
        logits = engine(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())  # next-token loss
        engine.backward(loss)
        if after_backward is not None:
            after_backward(engine)
        engine.step()
        losses.append(loss.item())
    return engine, losses
