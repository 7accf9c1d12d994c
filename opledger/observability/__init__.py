"""What an SRE watches: Prometheus metrics (`metrics`, the `[metrics]` extra) and
structured logs (`logs`). The ledger never imports this package; the tasks only count
(one increment per event, nothing that needs the database): what needs the ledger is read
when Prometheus scrapes (`ledger_gauges`)."""
