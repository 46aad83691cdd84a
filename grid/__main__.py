import sys

from grid.cli import main

sys.exit(main())
