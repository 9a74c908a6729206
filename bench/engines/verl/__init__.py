"""The verl engine (``python -m verl.trainer.main_ppo``), registered from :mod:`.launch`:

* :mod:`.launch`: the engine class (a cell -> argv, env, patches; the preflight of the machine);
* :mod:`.overrides`: the Hydra overrides of the run settings and the profiler, read back from an argv;
* :mod:`.config`: verl's Hydra config composed offline for a release (checks of the overrides);
* :mod:`.notes`: why a factor has no effect with the installed verl, and the patches' evidence of a run;
* :mod:`.probe`: the machine probe in a child process (verl imports, validate_config, devices).
"""
