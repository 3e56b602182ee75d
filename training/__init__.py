"""Training job: IDX data, the reference CNN as an Estimator, evaluation and versioned export."""
