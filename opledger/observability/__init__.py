"""What an SRE watches: Prometheus metrics (`metrics`, the `[metrics]` extra), structured
logs (`logs`) and OpenTelemetry traces (`tracing`, the `[tracing]` extra). The ledger never
imports this package; the tasks only count and trace (one call per event, nothing that
needs the database): what needs the ledger is read when Prometheus scrapes
(`ledger_gauges`)."""
