"""Coordination of broker groups on etcd (docs/cluster.md)."""
