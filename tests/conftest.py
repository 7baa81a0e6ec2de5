pytest_plugins = ["nimbus.testing.zookeeper"]
