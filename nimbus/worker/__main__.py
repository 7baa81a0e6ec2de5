"""Entry point: ``python -m nimbus.worker <worker-dir>``."""

import sys

from nimbus.worker.main import main

sys.exit(main())
