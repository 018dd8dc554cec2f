"""distnerf: distributed Neural Radiance Field training (data-parallel and spatial-segmentation
strategies, a pipelined ray sampler, per-step profiling). Entry points: ``python -m
distnerf.train``, ``distnerf.render``, ``distnerf.export``, ``distnerf.profile``; layout and
floors: README.md."""

__version__ = "0.1.0"
