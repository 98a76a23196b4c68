"""`python -m hicache_galahad`: the `galahad` command (cli.py)."""

import sys

from .cli import main

sys.exit(main())
