"""Training components below the strategies: the photometric loss, the optimizer and its
schedule, and the one optimisation step that the trainer and the balanced partition's
density fit both run. Nothing here knows about ranks."""
