"""Storm's Nimbus Thrift service (framed transport, binary protocol), loaded with thriftpy2,
and nimbus-ha's extension of it.

``storm`` is the module built from ``storm.thrift``: its structs (ClusterSummary,
NimbusSummary, TopologySummary, ...), exceptions and the ``Nimbus`` service, with Storm
1.x's field and argument ids so that Storm's own clients can talk to nimbus-ha.

``nimbus_ha`` is built from ``nimbus_ha.thrift``: the ``NimbusHa`` service, which extends
``Nimbus`` with nimbus-ha's own read calls (JSON answers). A nimbus serves ``NimbusHa``;
Storm's clients call Storm's methods by name and are not affected. ``storm`` is loaded
first so that both modules share the same struct and exception classes.
"""

from importlib import resources

import thriftpy2

with resources.as_file(resources.files("nimbus.thrift").joinpath("storm.thrift")) as _idl:
    storm = thriftpy2.load(str(_idl), module_name="storm_thrift")

with resources.as_file(resources.files("nimbus.thrift").joinpath("nimbus_ha.thrift")) as _idl:
    nimbus_ha = thriftpy2.load(str(_idl), module_name="nimbus_ha_thrift",
                               include_dirs=[str(_idl.parent)])

# Storm clients recognise a refused leader-only call by this prefix (Storm 1.x wording).
NOT_LEADER_PREFIX = "not a leader, current leader is "

__all__ = ["storm", "nimbus_ha", "NOT_LEADER_PREFIX"]
