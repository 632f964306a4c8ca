"""The stateless proxy: routes writes to a quorum of a slot's replicas and reads back from one."""
