"""Moved to :mod:`nimbus.distribution.distributors`; kept for plugins written for 0.1."""

import sys

from nimbus.distribution import distributors

sys.modules[__name__] = distributors
