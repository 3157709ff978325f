import sys

from sweeps.cli import main

sys.exit(main())
