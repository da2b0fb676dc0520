"""Training machinery that every job's loop calls: steps, optimizers, LoRA,
checkpoints, metrics."""
