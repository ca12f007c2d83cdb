"""KRaft's Raft for the metadata log: elections (Vote, BeginQuorumEpoch, EndQuorumEpoch), pull
replication between voters (Fetch, FetchSnapshot), the high watermark, and the quorum-state file.

`rules` holds the decisions as pure functions, `quorum_state` the durable election state, `state`
the voter's role and epoch in memory, `leader_state` what a leader knows of the other replicas.
The asyncio parts: `elections`, `replication` (a follower's fetches, the leader's appends),
`fetch_server` (the leader's answers to Fetch and FetchSnapshot) and `voter_channel` (requests
to the other voters); `client` wires them and runs the driving task."""
