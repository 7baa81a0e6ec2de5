"""The nimbus daemon: election, topology lifecycle, code sync and the leader's scheduler."""
