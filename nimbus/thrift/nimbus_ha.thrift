# nimbus-ha's own calls, on the same port as Storm's Nimbus service (nimbus/thrift/storm.thrift).
#
# NimbusHa extends Storm's Nimbus: a Storm client calls Storm's methods by name and never
# sees these; nimbus-ha's clients (topology-info, errors, top, logs, the UI with
# ui.source: thrift) call them with nothing but nimbus.seeds, no ZooKeeper credentials.
# Each answers a JSON document whose shape its docstring in nimbus/thrift/handler.py
# gives (docs/thrift-extensions.md); every nimbus answers them (leader or not), with the
# authorizer's read rules applied to the caller.

include "storm.thrift"

service NimbusHa extends storm.Nimbus {
  # One topology as `nimbus-ha topology-info --json` prints it (nimbus/master/runtime_view.py
  # topology_info): its workers and their state, components, errors.  Read rule of
  # getTopologyInfo.
  string getTopologyView(1: string id)
      throws (1: storm.NotAliveException e, 2: storm.AuthorizationException aze);
  # `nimbus-ha top`'s rows (nimbus/top.py topology_rows): every live topology the caller
  # may read.
  string getTopologyRows()
      throws (1: storm.AuthorizationException aze);
  # Where the logs of a topology's workers can be read: the logviewer of every live
  # supervisor (nimbus/master/log_sources.py).  Read rule of getTopologyInfo.
  string getLogSources(1: string id)
      throws (1: storm.NotAliveException e, 2: storm.AuthorizationException aze);
  # This nimbus's cluster summary, its records as ZooKeeper holds them: for a UI with
  # ui.source: thrift.  With an authorizer: nimbus.admins, nimbus.ui.users and
  # nimbus.daemon.users only.
  string getClusterRecords()
      throws (1: storm.AuthorizationException aze);

  # Upgrades (nimbus/master/upgrades.py): Storm has no call to change a running
  # topology's code, so these three are nimbus-ha's documented extension.
  #
  # Upload the bundle as for submitTopology (beginFileUpload, uploadChunk,
  # finishFileUpload), then run it as the next code version of live topology `name`: the
  # same topology id and checkpoints. `jsonConf` is overlaid on the running version's
  # conf; `strategy` is "all" (every worker at once) or "rolling" (one at a time). The
  # leader answers once the version is replicated (topology.min.replication.count) and
  # its switch has begun: {"topology_id": str, "version": int}. The leader only; owner
  # actions' rule (as killTopology).
  string upgradeTopology(1: string name, 2: string uploadedJarLocation, 3: string jsonConf,
                         4: string strategy)
      throws (1: storm.NotAliveException e, 2: storm.InvalidTopologyException ite,
              3: storm.AuthorizationException aze);
  # Switch live topology `name` to its kept code version `version` (0: the previous one;
  # during a switch, the version it switches from), every worker at once. Answer:
  # {"topology_id": str, "version": int}. The leader only; owner actions' rule.
  string rollbackTopology(1: string name, 2: i32 version)
      throws (1: storm.NotAliveException e, 2: storm.InvalidTopologyException ite,
              3: storm.AuthorizationException aze);
  # The code versions of live topology `name`: {"topology_id", "name", "running",
  # "switch": {"kind", "from", "to", "strategy", "started_secs", "deadline_secs", "by",
  # "switched"} or null, "versions": [{"version", "sha256", "submitter", "created_secs",
  # "state", "error"}] newest first}. Any nimbus; read rule of getTopologyInfo.
  string getTopologyHistory(1: string name)
      throws (1: storm.NotAliveException e, 2: storm.AuthorizationException aze);
}
