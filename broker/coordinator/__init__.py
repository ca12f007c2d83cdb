"""Coordinators: state machines whose state lives in an internal, compacted topic and moves with the
leadership of its partitions (group coordinator on __consumer_offsets; transaction and diskless
coordinators to come)."""
