"""`python -m cli ARGS...` is `tune ARGS...`."""

import sys

from cli.main import main

sys.exit(main())
