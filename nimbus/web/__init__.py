"""Serving HTTP to hostile clients, and talking to nimbus-ha's own HTTP servers.

Shared by every HTTP server of nimbus-ha (the UI, /metrics, each supervisor's logviewer)
and their clients, below all of them (docs/architecture.md, the ground floor):

* :mod:`nimbus.web.gate`: cheroot behind a gate that reads each request's head, and
  shakes TLS hands, before a worker thread sees the connection;
* :mod:`nimbus.web.request_head`: what a request's head may be, and the answers
  refusing it;
* :mod:`nimbus.web.client_cert`: HTTPS with client certificates of the cluster's CA,
  the caller's identity in the WSGI environ;
* :mod:`nimbus.web.logviewer_client`: a client of the supervisors' logviewers
  (``nimbus-ha logs``).
"""
