"""Chapter 07 (used again in 12): plan a real model on a real cluster — will it fit, how fast?

``plan("llama-3.1-70b", gpus=64, cluster="h100-80gb")`` lists every layout, each measured on
fake tensors with transformers' model code and torch's FSDP2/TP APIs, its speed predicted from
counted FLOPs and chapter 05's α-β model; ``python -m course_lib.plan`` prints the same table.
Modules: models, clusters, layouts, fake_step, predict, planner, show, exercises.
"""
