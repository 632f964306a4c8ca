"""``python -m metricsd``: the same as the ``metricsd`` command (how tests and ``cluster up`` start
processes with the running interpreter)."""

import sys

from metricsd.cmd.main import main

sys.exit(main())
