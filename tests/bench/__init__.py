"""Tests whose subject is a benchmark runner or a page under bench/ (the only tests that import bench)."""
