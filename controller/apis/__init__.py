"""Request handlers: thin translations between Kafka requests and the controller's managers.

One module per API family, each with a `HANDLERS` table; `registry` defines what a handler is
and receives (`Apis`), `catalog` gathers every module's table for the server.
"""
