"""nimbus-ha: a highly-available nimbus master for long-running topologies."""

__version__ = "0.1.0"
