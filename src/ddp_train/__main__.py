"""`python -m ddp_train` is the same as the `ddp-train` console script."""

import sys

from ddp_train.cli import main

sys.exit(main())
