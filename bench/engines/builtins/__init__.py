"""The built-in tiny model and data sets, shared by every engine that can run them (the embedded engine, and
verl on the ``verl:cpu`` target): ``builtin:qwen3vl-tiny`` (:mod:`.model`) and ``builtin:shapes`` /
``builtin:text`` / ``builtin:vl`` (:mod:`.data`), built once into the cache folder
(:func:`bench.engines.common.default_cache_dir`). No engine's internals are imported here."""
