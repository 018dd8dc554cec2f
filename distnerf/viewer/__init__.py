"""The web viewer (viser), without the training loop: what it shows and the server that shows it.

- :mod:`.frames`: camera conversions (OpenGL ``c2w`` <-> viser's OpenCV pose), frame sizes, the
  colouring of a rendered frame, thumbnails, the frame records. No server.
- :mod:`.server`: :class:`~.server.ViewerServer`, the viser server (scene, frustums, clients, frames).

Floors. This package sits beside ``observe`` (below ``engine``) and imports only ``data``: the
server renders with the function its owner gives it (evaluation's
:func:`~distnerf.engine.evaluate.render_image`). Its owners import it from above: the entry point
``distnerf.view`` (a run's checkpoints) and the trainer's live hook,
:mod:`distnerf.engine.live_view` (``viewer.enabled=true``), which lives in ``engine/`` because it
renders with evaluation's function and is called by the trainer between steps.
"""
