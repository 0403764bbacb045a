"""`python -m leasehold ...` is the `leasehold` command."""

import sys

from leasehold._server.cli.main import main

sys.exit(main())
