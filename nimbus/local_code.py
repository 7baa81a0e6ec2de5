"""Moved to :mod:`nimbus.distribution.local_code`; kept for plugins written for 0.1."""

import sys

from nimbus.distribution import local_code

sys.modules[__name__] = local_code
