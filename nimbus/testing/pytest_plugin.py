"""The ``pytest11`` entry point of nimbus-ha: the plugin authors' test kit.

Installing nimbus-ha makes pytest load this module in every run (disable it with
``-p no:nimbus_ha``). It only lists the modules that hold the fixtures, each under its
own module name: a conftest or test module that still says
``pytest_plugins = ["nimbus.testing.zookeeper"]`` (or ``"nimbus.testing.kit"``) then finds
the module registered already, and pytest skips it instead of refusing to register the
same module twice under two names.
"""

pytest_plugins = ["nimbus.testing.zookeeper", "nimbus.testing.kit"]
