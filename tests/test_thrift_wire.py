"""Spot checks of field ids that Storm's clients depend on (storm.thrift, Storm 1.x).

The expected ids here are typed by hand.  The full comparison of every struct, method and
enum against an independent copy of Storm's own IDL is tests/test_thrift_idl_vs_storm.py.
"""

from nimbus.thrift import storm


def ids(struct):
    return {spec[1]: fid for fid, spec in struct.thrift_spec.items()}


def test_cluster_summary_and_nimbus_summary_ids():
    assert ids(storm.ClusterSummary) == {"supervisors": 1, "nimbus_uptime_secs": 2,
                                         "topologies": 3, "nimbuses": 4}
    assert ids(storm.NimbusSummary) == {"host": 1, "port": 2, "uptime_secs": 3,
                                        "isLeader": 4, "version": 5}


def test_topology_summary_ids():
    got = ids(storm.TopologySummary)
    assert got["id"] == 1 and got["name"] == 2 and got["status"] == 7
    assert got["replication_count"] == 515 and got["owner"] == 514


def test_service_has_the_methods_storm_clients_call():
    for method in ("getClusterInfo", "getLeader", "getNimbusConf", "getTopologyInfo",
                   "submitTopology", "submitTopologyWithOpts", "killTopology",
                   "killTopologyWithOpts", "activate", "deactivate", "beginFileUpload",
                   "uploadChunk", "finishFileUpload", "beginFileDownload", "downloadChunk"):
        assert method in storm.Nimbus.thrift_services
    assert ids(storm.KillOptions) == {"wait_secs": 1}
    assert ids(storm.SubmitOptions)["initial_status"] == 1
