"""Storm's Nimbus Thrift service (framed transport, binary protocol), loaded with thriftpy2.

``storm`` is the module built from ``storm.thrift``: its structs (ClusterSummary,
NimbusSummary, TopologySummary, ...), exceptions and the ``Nimbus`` service, with Storm
1.x's field and argument ids so that Storm's own clients can talk to nimbus-ha.
"""

from importlib import resources

import thriftpy2

with resources.as_file(resources.files("nimbus.thrift").joinpath("storm.thrift")) as _idl:
    storm = thriftpy2.load(str(_idl), module_name="storm_thrift")

# Storm clients recognise a refused leader-only call by this prefix (Storm 1.x wording).
NOT_LEADER_PREFIX = "not a leader, current leader is "

__all__ = ["storm", "NOT_LEADER_PREFIX"]
