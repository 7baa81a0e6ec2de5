"""Every supervisor's logviewer: its workers' logs over HTTP(S), at Storm logviewer's
REST paths (docs/logs.md).

* :mod:`~nimbus.supervisor.logviewer.server`: the server's lifecycle and threads;
* :mod:`~nimbus.supervisor.logviewer.app`: the paths and their answers;
* :mod:`~nimbus.supervisor.logviewer.files`: which files may be served, opened without
  following a link;
* :mod:`~nimbus.supervisor.logviewer.search`: Storm's search and deep search;
* :mod:`~nimbus.supervisor.logviewer.access`: who may read a topology's logs.
"""
