"""python -m longmem ..."""

import sys

from longmem.cli.main import main

sys.exit(main())
