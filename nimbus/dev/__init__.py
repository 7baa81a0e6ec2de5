"""What ships for development on one machine, apart from the daemons: the dev cluster
(``nimbus-ha dev-cluster``: ZooKeeper, nimbuses and supervisors on loopback), its watch
over the daemons, the demo (``--demo``) and the records it feeds its sample pipeline, the
ZooKeeper launcher (``nimbus-ha zookeeper``, and the test kit's ``zk_server``), and the
commands that run them.

    cluster.py    the local cluster: ZooKeeper plus nimbus and supervisor processes
    watch.py      report (and restart) the daemons that exit while dev-cluster runs
    demo.py       dev-cluster --demo: a leader's failover, then the pipeline's
    feed.py       records into the example word-count pipeline, its committed output
    zookeeper.py  a real ZooKeeper server or ensemble on loopback, free ports
    commands.py   nimbus-ha zookeeper and nimbus-ha dev-cluster

Nothing of the daemons imports this package; the CLI registers its commands.
"""
