"""The Strata controller: owns the cluster metadata log, serves it to brokers, and handles
broker registration, heartbeats, fencing, topic and config changes.

Run it with ``python -m controller --config server.properties``.
"""
