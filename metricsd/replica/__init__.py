"""A store's duties as a replica in a cluster: serving only the slots its shard map gives it
(``ownership``), catching up from its peers and anti-entropy (``replication``, ``catchup``,
``catchup_client``, ``digest``), and the store-to-store RPCs (``servicer``)."""
