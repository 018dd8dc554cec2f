"""The DDP-vs-SS characterisation as one command: ``python -m distnerf.study``.

A study config (``conf/study/*.yaml``) declares a matrix of training runs (:mod:`.plan`);
``run`` trains each cell as an ordinary run directory, locally or on Slurm, resumably
(:mod:`.runner`); ``report`` turns the cells' profiles and metrics into tables, figures and a
scaling model (:mod:`.collect`, :mod:`.report`, :mod:`.scaling`). This package sits on top:
it launches ``distnerf.train`` through ``launch/`` and reads run directories, and nothing
below imports it.
"""
