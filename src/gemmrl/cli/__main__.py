"""``python -m gemmrl.cli``: the `gemmrl` command."""

import sys

from gemmrl.cli.main import main

sys.exit(main())
