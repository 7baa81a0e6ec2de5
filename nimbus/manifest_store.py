"""Moved to :mod:`nimbus.distribution.manifest_store`; kept for plugins written for 0.1."""

import sys

from nimbus.distribution import manifest_store

sys.modules[__name__] = manifest_store
