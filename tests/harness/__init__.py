"""Code the tests share, in one place: tests import from here, never from another test module or a conftest.

- `processes`: `wait_until` (a deadline on a condition, never a sleep), `Spawner` (every child reaped), `free_port`,
  `run_gputop`, and /proc helpers for a job's threads and children.
- `histories`: hand-built snapshots and histories (the diagnosis' `Scenario`s, the TUI's scripted
  screens and `ScriptedSource`), `record()` for recordings, `simulated_history()` over the fake NVML.
- `nvml`: `ScriptedLoad`, a fake-NVML load model whose answers the test sets.
- `train_jobs`: the one place that builds command lines for the training job (tests/jobs/train_job.py): the
  option sets each test uses, starting it and waiting for its ranks, and reading its step log (the truth).
- `tui`: build a `GputopApp` over a scripted source, and wait (on conditions) until it has drawn.
- `demo`: `DemoJobs` (demo jobs with a pipeline each, all stopped at teardown) and `rank_pids`.
- `machine_check`: what `gputop check` collects on the simulated machine, without waiting; a scripted TUI check.
"""
