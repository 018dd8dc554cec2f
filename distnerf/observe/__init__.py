"""Observation: image metrics, loggers, step timers."""
