"""`python -m ddp_launch`: the same as the ddp-launch console script."""

import sys

from ddp_launch.cli import main

sys.exit(main())
