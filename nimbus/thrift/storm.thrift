# Trimmed Thrift IDL for the Apache Storm 1.x Nimbus service (nimbus-ha).
#
# Only the subset of Storm's storm.thrift needed to serve the Nimbus methods
# listed in the service block below is declared here.  Field ids, types,
# required/optional markers and exception ids follow Storm 1.1.x / 1.2.x so
# that stock Storm clients (framed transport, binary protocol) interoperate.
# Do not renumber anything in this file.
# tests/test_thrift_idl_vs_storm.py compares every declaration here with Storm's
# own storm.thrift (Storm 1.1.1, as embedded in the streamparse package).

namespace py nimbus_storm
namespace java org.apache.storm.generated

# ---------------------------------------------------------------------------
# Topology definition (StormTopology and its parts)
# ---------------------------------------------------------------------------

union JavaObjectArg {
  1: i32 int_arg;
  2: i64 long_arg;
  3: string string_arg;
  4: bool bool_arg;
  5: binary binary_arg;
  6: double double_arg;
}

struct JavaObject {
  1: required string full_class_name;
  2: required list<JavaObjectArg> args_list;
}

struct NullStruct {
}

struct GlobalStreamId {
  1: required string componentId;
  2: required string streamId;
}

union Grouping {
  1: list<string> fields;
  2: NullStruct shuffle;
  3: NullStruct all;
  4: NullStruct none;
  5: NullStruct direct;
  6: JavaObject custom_object;
  7: binary custom_serialized;
  8: NullStruct local_or_shuffle;
}

struct StreamInfo {
  1: required list<string> output_fields;
  2: required bool direct;
}

# Both fields are default-requiredness (neither required nor optional) in Storm.
struct ShellComponent {
  1: string execution_command;
  2: string script;
}

union ComponentObject {
  1: binary serialized_java;
  2: ShellComponent shell;
  3: JavaObject java_object;
}

struct ComponentCommon {
  1: required map<GlobalStreamId, Grouping> inputs;
  2: required map<string, StreamInfo> streams;
  3: optional i32 parallelism_hint;
  4: optional string json_conf;
}

struct SpoutSpec {
  1: required ComponentObject spout_object;
  2: required ComponentCommon common;
}

struct Bolt {
  1: required ComponentObject bolt_object;
  2: required ComponentCommon common;
}

struct StateSpoutSpec {
  1: required ComponentObject state_spout_object;
  2: required ComponentCommon common;
}

# Fields 5-6 exist since 1.1.0, fields 7-8 since 1.1.1 / 1.0.4.
# Storm 2.x additionally has 9 (component_to_shared_memory) and 10 (shared_memory).
struct StormTopology {
  1: required map<string, SpoutSpec> spouts;
  2: required map<string, Bolt> bolts;
  3: required map<string, StateSpoutSpec> state_spouts;
  4: optional list<binary> worker_hooks;
  5: optional list<string> dependency_jars;
  6: optional list<string> dependency_artifacts;
  7: optional string storm_version;
  8: optional string jdk_version;
}

# ---------------------------------------------------------------------------
# Exceptions
# ---------------------------------------------------------------------------

exception AlreadyAliveException {
  1: required string msg;
}

exception NotAliveException {
  1: required string msg;
}

exception AuthorizationException {
  1: required string msg;
}

exception InvalidTopologyException {
  1: required string msg;
}

# ---------------------------------------------------------------------------
# Cluster / topology summaries (getClusterInfo, getLeader)
# ---------------------------------------------------------------------------

struct TopologySummary {
    1: required string id;
    2: required string name;
    3: required i32 num_tasks;
    4: required i32 num_executors;
    5: required i32 num_workers;
    6: required i32 uptime_secs;
    7: required string status;
  513: optional string sched_status;
  514: optional string owner;
  515: optional i32 replication_count;
  521: optional double requested_memonheap;
  522: optional double requested_memoffheap;
  523: optional double requested_cpu;
  524: optional double assigned_memonheap;
  525: optional double assigned_memoffheap;
  526: optional double assigned_cpu;
}

struct SupervisorSummary {
  1: required string host;
  2: required i32 uptime_secs;
  3: required i32 num_workers;
  4: required i32 num_used_workers;
  5: required string supervisor_id;
  6: optional string version = "VERSION_NOT_PROVIDED";
  7: optional map<string, double> total_resources;
  8: optional double used_mem;
  9: optional double used_cpu;
}

struct NimbusSummary {
  1: required string host;
  2: required i32 port;
  3: required i32 uptime_secs;
  4: required bool isLeader;
  5: required string version;
}

# Field 2 is deprecated in 1.x and removed (id reserved) in 2.x.
struct ClusterSummary {
  1: required list<SupervisorSummary> supervisors;
  2: optional i32 nimbus_uptime_secs = 0;
  3: required list<TopologySummary> topologies;
  4: required list<NimbusSummary> nimbuses;
}

# ---------------------------------------------------------------------------
# Topology info (getTopologyInfo)
# ---------------------------------------------------------------------------

struct ErrorInfo {
  1: required string error;
  2: required i32 error_time_secs;
  3: optional string host;
  4: optional i32 port;
}

struct BoltStats {
  1: required map<string, map<GlobalStreamId, i64>> acked;
  2: required map<string, map<GlobalStreamId, i64>> failed;
  3: required map<string, map<GlobalStreamId, double>> process_ms_avg;
  4: required map<string, map<GlobalStreamId, i64>> executed;
  5: required map<string, map<GlobalStreamId, double>> execute_ms_avg;
}

struct SpoutStats {
  1: required map<string, map<string, i64>> acked;
  2: required map<string, map<string, i64>> failed;
  3: required map<string, map<string, double>> complete_ms_avg;
}

union ExecutorSpecificStats {
  1: BoltStats bolt;
  2: SpoutStats spout;
}

# Outer map keys are time windows (":all-time", "600", ...), inner keys stream ids.
struct ExecutorStats {
  1: required map<string, map<string, i64>> emitted;
  2: required map<string, map<string, i64>> transferred;
  3: required ExecutorSpecificStats specific;
  4: required double rate;
}

struct ExecutorInfo {
  1: required i32 task_start;
  2: required i32 task_end;
}

# Id 6 is unused in Storm.
struct ExecutorSummary {
  1: required ExecutorInfo executor_info;
  2: required string component_id;
  3: required string host;
  4: required i32 port;
  5: required i32 uptime_secs;
  7: optional ExecutorStats stats;
}

struct DebugOptions {
  1: optional bool enable;
  2: optional double samplingpct;
}

struct TopologyInfo {
    1: required string id;
    2: required string name;
    3: required i32 uptime_secs;
    4: required list<ExecutorSummary> executors;
    5: required string status;
    6: required map<string, list<ErrorInfo>> errors;
    7: optional map<string, DebugOptions> component_debug;
  513: optional string sched_status;
  514: optional string owner;
  515: optional i32 replication_count;
  521: optional double requested_memonheap;
  522: optional double requested_memoffheap;
  523: optional double requested_cpu;
  524: optional double assigned_memonheap;
  525: optional double assigned_memoffheap;
  526: optional double assigned_cpu;
}

# ---------------------------------------------------------------------------
# Page info (getTopologyPageInfo, getSupervisorPageInfo, getComponentPageInfo):
# Storm UI's aggregates, Storm 1.1.1's definitions.  Window maps are keyed by
# ":all-time", "600", "10800", "86400"; docs/how-it-works.md says what nimbus-ha
# puts in each field.
# ---------------------------------------------------------------------------

struct CommonAggregateStats {
  1: optional i32 num_executors;
  2: optional i32 num_tasks;
  3: optional i64 emitted;
  4: optional i64 transferred;
  5: optional i64 acked;
  6: optional i64 failed;
  7: optional map<string, double> resources_map;
}

struct SpoutAggregateStats {
  1: optional double complete_latency_ms;
}

struct BoltAggregateStats {
  1: optional double execute_latency_ms;
  2: optional double process_latency_ms;
  3: optional i64 executed;
  4: optional double capacity;
}

union SpecificAggregateStats {
  1: BoltAggregateStats bolt;
  2: SpoutAggregateStats spout;
}

enum ComponentType {
  BOLT = 1,
  SPOUT = 2
}

struct ComponentAggregateStats {
  1: optional ComponentType type;
  2: optional CommonAggregateStats common_stats;
  3: optional SpecificAggregateStats specific_stats;
  4: optional ErrorInfo last_error;
}

struct TopologyStats {
  1: optional map<string, i64> window_to_emitted;
  2: optional map<string, i64> window_to_transferred;
  3: optional map<string, double> window_to_complete_latencies_ms;
  4: optional map<string, i64> window_to_acked;
  5: optional map<string, i64> window_to_failed;
}

struct WorkerSummary {
    1: optional string supervisor_id;
    2: optional string host;
    3: optional i32 port;
    4: optional string topology_id;
    5: optional string topology_name;
    6: optional i32 num_executors;
    7: optional map<string, i64> component_to_num_tasks;
    8: optional i32 time_secs;
    9: optional i32 uptime_secs;
  521: optional double requested_memonheap;
  522: optional double requested_memoffheap;
  523: optional double requested_cpu;
  524: optional double assigned_memonheap;
  525: optional double assigned_memoffheap;
  526: optional double assigned_cpu;
}

struct SupervisorPageInfo {
  1: optional list<SupervisorSummary> supervisor_summaries;
  2: optional list<WorkerSummary> worker_summaries;
}

struct TopologyPageInfo {
    1: required string id;
    2: optional string name;
    3: optional i32 uptime_secs;
    4: optional string status;
    5: optional i32 num_tasks;
    6: optional i32 num_workers;
    7: optional i32 num_executors;
    8: optional string topology_conf;
    9: optional map<string, ComponentAggregateStats> id_to_spout_agg_stats;
   10: optional map<string, ComponentAggregateStats> id_to_bolt_agg_stats;
   11: optional string sched_status;
   12: optional TopologyStats topology_stats;
   13: optional string owner;
   14: optional DebugOptions debug_options;
   15: optional i32 replication_count;
   16: optional list<WorkerSummary> workers;
  521: optional double requested_memonheap;
  522: optional double requested_memoffheap;
  523: optional double requested_cpu;
  524: optional double assigned_memonheap;
  525: optional double assigned_memoffheap;
  526: optional double assigned_cpu;
}

struct ExecutorAggregateStats {
  1: optional ExecutorSummary exec_summary;
  2: optional ComponentAggregateStats stats;
}

struct ComponentPageInfo {
   1: required string component_id;
   2: required ComponentType component_type;
   3: optional string topology_id;
   4: optional string topology_name;
   5: optional i32 num_executors;
   6: optional i32 num_tasks;
   7: optional map<string, ComponentAggregateStats> window_to_stats;
   8: optional map<GlobalStreamId, ComponentAggregateStats> gsid_to_input_stats;
   9: optional map<string, ComponentAggregateStats> sid_to_output_stats;
  10: optional list<ExecutorAggregateStats> exec_stats;
  11: optional list<ErrorInfo> errors;
  12: optional string eventlog_host;
  13: optional i32 eventlog_port;
  14: optional DebugOptions debug_options;
  15: optional string topology_status;
  16: optional map<string, double> resources_map;
}

# ---------------------------------------------------------------------------
# Options for submit / kill / rebalance
# ---------------------------------------------------------------------------

struct KillOptions {
  1: optional i32 wait_secs;
}

# nimbus-ha honours num_workers only (num_executors is refused with
# InvalidTopologyException: a worker runs whole components).
struct RebalanceOptions {
  1: optional i32 wait_secs;
  2: optional i32 num_workers;
  3: optional map<string, i32> num_executors;
}

struct Credentials {
  1: required map<string, string> creds;
}

enum TopologyInitialStatus {
  ACTIVE = 1,
  INACTIVE = 2
}

struct SubmitOptions {
  1: required TopologyInitialStatus initial_status;
  2: optional Credentials creds;
}

# ---------------------------------------------------------------------------
# Nimbus service (subset).  Wire dispatch is by method name; the numbers
# below are the argument / exception field ids inside the *_args and
# *_result structs.
# ---------------------------------------------------------------------------

service Nimbus {
  void submitTopology(1: string name, 2: string uploadedJarLocation, 3: string jsonConf, 4: StormTopology topology)
      throws (1: AlreadyAliveException e, 2: InvalidTopologyException ite, 3: AuthorizationException aze);
  void submitTopologyWithOpts(1: string name, 2: string uploadedJarLocation, 3: string jsonConf, 4: StormTopology topology, 5: SubmitOptions options)
      throws (1: AlreadyAliveException e, 2: InvalidTopologyException ite, 3: AuthorizationException aze);
  void killTopology(1: string name)
      throws (1: NotAliveException e, 2: AuthorizationException aze);
  void killTopologyWithOpts(1: string name, 2: KillOptions options)
      throws (1: NotAliveException e, 2: AuthorizationException aze);
  void activate(1: string name)
      throws (1: NotAliveException e, 2: AuthorizationException aze);
  void deactivate(1: string name)
      throws (1: NotAliveException e, 2: AuthorizationException aze);
  void rebalance(1: string name, 2: RebalanceOptions options)
      throws (1: NotAliveException e, 2: InvalidTopologyException ite, 3: AuthorizationException aze);

  string beginFileUpload()
      throws (1: AuthorizationException aze);
  void uploadChunk(1: string location, 2: binary chunk)
      throws (1: AuthorizationException aze);
  void finishFileUpload(1: string location)
      throws (1: AuthorizationException aze);

  # Present throughout 1.x (deprecated there); removed in 2.x.
  string beginFileDownload(1: string file)
      throws (1: AuthorizationException aze);
  binary downloadChunk(1: string id)
      throws (1: AuthorizationException aze);

  string getNimbusConf()
      throws (1: AuthorizationException aze);
  ClusterSummary getClusterInfo()
      throws (1: AuthorizationException aze);
  # Since 1.1.0.
  NimbusSummary getLeader()
      throws (1: AuthorizationException aze);
  TopologyInfo getTopologyInfo(1: string id)
      throws (1: NotAliveException e, 2: AuthorizationException aze);
  string getTopologyConf(1: string id)
      throws (1: NotAliveException e, 2: AuthorizationException aze);
  StormTopology getTopology(1: string id)
      throws (1: NotAliveException e, 2: AuthorizationException aze);
  StormTopology getUserTopology(1: string id)
      throws (1: NotAliveException e, 2: AuthorizationException aze);
  # Storm UI's pages (Storm 1.1.1's signatures).  getSupervisorPageInfo takes a supervisor id or,
  # with id unset, a host; window and is_include_sys may be left unset (":all-time",
  # false).
  TopologyPageInfo getTopologyPageInfo(1: string id, 2: string window, 3: bool is_include_sys)
      throws (1: NotAliveException e, 2: AuthorizationException aze);
  SupervisorPageInfo getSupervisorPageInfo(1: string id, 2: string host, 3: bool is_include_sys)
      throws (1: NotAliveException e, 2: AuthorizationException aze);
  ComponentPageInfo getComponentPageInfo(1: string topology_id, 2: string component_id, 3: string window, 4: bool is_include_sys)
      throws (1: NotAliveException e, 2: AuthorizationException aze);
}
