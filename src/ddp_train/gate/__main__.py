"""`python -m ddp_train.gate`: the fabric gate (run.py)."""

import sys

from ddp_train.gate.run import main

sys.exit(main())
