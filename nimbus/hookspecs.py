"""Moved to :mod:`nimbus.distribution.hookspecs`; kept for plugins written for 0.1."""

import sys

from nimbus.distribution import hookspecs

sys.modules[__name__] = hookspecs
