"""`python -m tracetune ARGS...` is `tune ARGS...`."""

import sys

from tracetune.cli.main import main

sys.exit(main())
