"""`python -m hicache_galahad`: the `galahad` command (cli.py)."""

import sys

from .ops.cli import main

sys.exit(main())
