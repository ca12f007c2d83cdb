"""KIP-714 client telemetry on a broker: the client instances that ask for subscriptions and push
metrics (`clients`), and their latest metrics as Prometheus families."""
