"""`python -m ddp_bench` is the same as the `ddp-bench` console script."""

import sys

from ddp_bench.cli import main

sys.exit(main())
