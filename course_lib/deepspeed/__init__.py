"""Chapter 08: DeepSpeed ZeRO stages on the course's ranks, measured from the engine's tensors.

DeepSpeed itself is imported only inside functions (:mod:`course_lib.deepspeed.load`): it is an
optional, heavy dependency."""
