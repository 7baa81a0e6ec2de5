"""The daemons' composition roots: each builds one process's parts (the master or the
supervisor, and the transport, screens and metrics around it) and wires them together.
Nothing below this layer imports them."""
