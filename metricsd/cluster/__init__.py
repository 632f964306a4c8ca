"""The cluster's coordination: the key-value interface and its etcd implementation, slot hashing,
the shard map, slot assignment and leader election."""
