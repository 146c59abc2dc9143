"""Chapter 07 (used again in 12): plan a real model on a real cluster — will it fit, how fast?

``plan("llama-3.1-70b", gpus=64, cluster="h100-80gb")`` lists every layout, each measured on
fake tensors with transformers' model code and torch's FSDP2/TP APIs, its speed predicted from
counted FLOPs and chapter 05's α-β model; ``python -m course_lib.plan`` prints the same table.
``plan_course(layout)`` plans the course GPT with chapter 12's recipe, each rank's peak checked
against real ranks; ``measure_real`` runs a planner layout of a small real architecture on CPU
ranks, to check the plan on your own machine. Modules: models, clusters, layouts, recipe,
fake_step, predict, planner, course, real, show, exercises.
"""
