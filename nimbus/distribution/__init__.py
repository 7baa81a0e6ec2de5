"""Topology code: bundles, the local code store, transfers and the pluggable distributors.

This package is the plugin authors' API (``hookspecs``, ``distributors``, ``local_code``,
``manifest_store``, ``transfer_meter``).
"""
