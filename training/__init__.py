"""Training job: IDX data, the CNN Estimator and its baselines, evaluation, versioned export,
comparison, fine-tuning, distributed training and batch prediction."""
