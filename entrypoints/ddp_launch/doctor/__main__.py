"""`python -m ddp_launch.doctor`: the same as `ddp-launch doctor`."""

import sys

from ddp_launch.doctor import main

sys.exit(main())
