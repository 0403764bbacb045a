"""`python -m leasehold ...` is the `leasehold` command."""

import sys

from leasehold._server.cli import main

sys.exit(main())
