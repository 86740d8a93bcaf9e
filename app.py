"""Start the LongMem web app: ``python app.py`` (``--help`` for the options)."""

import sys

from app.main import main

if __name__ == "__main__":
    sys.exit(main())
