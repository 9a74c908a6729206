"""Engines turn a planned cell into a launch: ``embedded`` (one-process GRPO) and ``verl`` (main_ppo)."""
