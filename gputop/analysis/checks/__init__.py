"""One module per family of checks; `gputop.analysis.diagnosis` runs them."""
