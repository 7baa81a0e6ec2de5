"""A code distributor that does nothing, for tests and benchmarks whose subject is not the
distributor (the code sync, the control plane): subclass it and override the hooks the
test is about. Every hook is a ``@hookimpl``, so a subclass is a complete plugin."""

from __future__ import annotations

from nimbus.distribution.hookspecs import hookimpl


class StubDistributor:
    """No shared store: uploads return the directory, downloads fail, no replicas."""

    name = "stub"

    @hookimpl
    def prepare(self, conf, context):
        pass

    @hookimpl
    def upload(self, dir_path, topology_id):
        return dir_path

    @hookimpl
    def download(self, dest_dir, topology_id, metafile):
        raise RuntimeError(f"{self.name}: downloads are not part of this test")

    @hookimpl
    def get_replication_count(self, topology_id):
        return 0

    @hookimpl
    def cleanup(self, topology_id):
        pass

    @hookimpl
    def delete_shared(self, topology_id):
        pass

    @hookimpl
    def close(self, conf):
        pass
