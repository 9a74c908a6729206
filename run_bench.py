#!/usr/bin/env python
"""Entry point: ``python run_bench.py MATRIX.yaml`` (see ``python run_bench.py --help``)."""

import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
