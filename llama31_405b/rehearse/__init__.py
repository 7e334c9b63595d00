"""The dress rehearsal: every chosen rank of a full-size launch played on one CPU, before any
cluster time is spent (`python -m llama31_405b rehearse CONFIG`; docs/rehearsal.md).

Modules, one concern each:
  fake_world    torch's fake process-group backend at the config's world size
  meta_compat   what megatron-core needs to build on the meta device
  allocation    the synthetic Slurm allocation and the placement check's verdict on it
  ranks         which ranks to play
  rank          one rank, in its own process: groups, placement, model, DDP, optimizer
  measure       bytes from Megatron's buffers and optimizer tensors
  dataset       the samples the run requests, the size and build time of the index
  planner_view  the planner's prediction for the same rank
  run           the rehearsal: rank processes, header, precheck, verdict
  report        the report (text and JSON)
Nothing here imports torch at module level except rank/measure/meta_compat, which run in the rank
processes.
"""
