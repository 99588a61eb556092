"""``python -m trajectory_ensemble_node.cli ...``: the same as ``trajectory-ensemble ...`` (tests and the launcher run
the node this way, without relying on the console script being on ``PATH``)."""

import sys

from .dispatch import main

sys.exit(main())
