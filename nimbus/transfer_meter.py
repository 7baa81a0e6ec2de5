"""Moved to :mod:`nimbus.distribution.transfer_meter`; kept for plugins written for 0.1."""

import sys

from nimbus.distribution import transfer_meter

sys.modules[__name__] = transfer_meter
