"""KRaft's Raft for the metadata log: elections (Vote, BeginQuorumEpoch, EndQuorumEpoch), pull
replication between voters (Fetch, FetchSnapshot), the high watermark, and the quorum-state file.

`rules` holds the decisions as pure functions, `quorum_state` the durable election state,
`client` the asyncio part that runs timers and talks to the other voters."""
