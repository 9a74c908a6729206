"""The ``verl:cpu`` target: real ``verl.trainer.main_ppo`` runs on a CPU-only machine.

- :mod:`.target`: the overrides, environment and patches every ``verl:cpu`` run gets, each with the
  reason it is needed (the verl platform itself lives in ``patches/bench_patches/verl_cpu_platform.py``,
  the process workarounds in ``patches/bench_patches/verl_cpu.py``);
- :mod:`.assets`: the tiny Qwen3 / Qwen3-VL and the RL parquets (text, images) built locally on first use;
- :mod:`.reward`: the reward function verl loads by path;
- :mod:`.smoke`: ``run_bench.py MATRIX --smoke``: any verl matrix's cells, one or two real steps on CPU.
"""
