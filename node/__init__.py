"""What every Strata process (broker or controller) has: config, logging, the framed request
server and the client used to talk to other nodes."""
