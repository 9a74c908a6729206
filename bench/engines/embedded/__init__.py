"""Embedded GRPO engine: real GRPO steps in one process on CPU, CUDA or NPU, written in verl's formats.

Modules (one job each): ``config`` (run settings), ``data`` (prompt sets), ``model`` (build/load the
model), ``fused`` (RMSNorm optimization), ``forward`` (micro-batch forward and log-probs), ``rollout``
(sampling), ``reward`` (rule scores), ``batching`` (micro-batches), ``step`` (one GRPO step),
``profiling`` (torch.profiler), ``run`` (a whole run), ``__main__`` (CLI).

Importing this package is cheap: torch, transformers and verl load only when a run starts.
"""
