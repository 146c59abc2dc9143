"""The scripts a learner copies: one per strategy (ddp.py, fsdp.py, tensor_parallel.py,
pipeline.py, checkpoint.py; chapter 09's mesh_2d.py) and the first one
(hello_allreduce.py), each calling ``init_process_group`` itself and importing nothing from the
course but ``tiny`` (the file beside them), which needs only ``course_lib.common``. Each runs
under ``torchrun``, and all but hello_allreduce.py alone too.

The harness's worker scripts that lived here moved to their chapters (:data:`MOVED`); their old
names still run and import for one release, with a ``DeprecationWarning``.
"""
#: old worker module -> its new home (the files here that serve the old names go next release)
MOVED = {"train_dp": "course_lib.data_parallel.train_dp",
         "train_ddp": "course_lib.communication.train_ddp",
         "train_ft": "course_lib.fault_tolerance.train_ft",
         "train_deepspeed": "course_lib.deepspeed.train_deepspeed",
         "train_gpt": "course_lib.capstone.train_gpt"}
