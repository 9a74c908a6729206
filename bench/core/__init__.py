"""The harness's basic services, used by every other package of ``bench/``: the errors reported to the user as one
line and the step in progress (``errors``), bounded and safe reading of every input file (``inputs``), checks of
the folders the harness will write (``paths``), the entry-point registries that find engines, readers,
optimizations and tests (``plugins``) and the registry of engines built on them (``engine_registry``), atomic
writes and bounded JSON reads of the harness's own files (``files``), how a run's process ended (``process``) and
the run metadata (package versions, git commit, device runtime, machine and load: ``metadata``)."""
