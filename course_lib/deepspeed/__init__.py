"""Chapter 08: DeepSpeed ZeRO stages on the course's ranks, measured from the engine's tensors.

DeepSpeed itself is imported only inside functions (:mod:`course_lib.deepspeed.load`): it is an
optional, heavy dependency. The one exception is :mod:`course_lib.deepspeed.ranks`, the code the
ranks run: it imports DeepSpeed at its top so that the warm fork server imports it once."""
