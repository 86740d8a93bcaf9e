"""python -m longmem ..."""

import sys

from .cli import main

sys.exit(main())
