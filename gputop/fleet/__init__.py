"""One job across several machines: the job identity all its nodes agree on (`identity`), the
cross-node view that reads every node's `gputop serve` through Prometheus's HTTP API (`prometheus`,
`view`), refreshed live (`live`), and a Slurm job's nodes and label (`slurm`).  gputop builds no
aggregator of its own: Prometheus is the engine for many machines."""
