"""Procedural default scenes (moved into a package; split into modules next)."""
from distnerf.data.synthetic.primitives import *  # noqa: F401,F403
