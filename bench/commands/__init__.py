"""The subcommands' argument parsing and printing (``run_bench.py <command>``); the work they start lives
in the modules they call."""
