"""What the cluster knows, kept in ZooKeeper: the layout, its records and the server."""
