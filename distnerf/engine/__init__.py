"""Training loop, losses, optimizer/schedule, evaluation."""
