"""Cluster mode: the write log on NATS JetStream, of which each node's RocksDB is a view."""
