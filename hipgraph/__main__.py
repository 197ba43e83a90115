"""``python -m hipgraph`` runs the command line."""

import sys

from hipgraph.cli import main

sys.exit(main())
