"""One job across several machines: the job identity all its nodes agree on (`identity`), and the
cross-node view that reads every node's `gputop serve` through Prometheus's HTTP API (`prometheus`,
`verdict`).  gputop builds no aggregator of its own: Prometheus is the engine for many machines."""
