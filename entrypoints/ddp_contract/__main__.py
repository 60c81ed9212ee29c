"""`python3 -m ddp_contract dataset DIR` (the job scripts' dataset check on the host)."""

import sys

from ddp_contract import main

sys.exit(main())
