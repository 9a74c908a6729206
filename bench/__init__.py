"""GRPO ablation benchmark harness: matrix -> plan -> run -> measure -> record -> decide."""

__version__ = "0.1.0"
