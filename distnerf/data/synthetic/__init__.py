"""Procedural default scenes, rendered analytically and written in Blender format.

Legend: N rays (one per sub-pixel sample), H, W image size in pixels, V views of a split,
K primitives of a scene.

With no dataset given, distnerf trains on a small scene that it generates itself:
:func:`ensure_scene` renders it once into a cache directory, in the nerf_synthetic
("Blender") layout (see :mod:`~distnerf.data.synthetic.writer`), and every later call
(from any rank) reuses it. Two kinds of scene: ``"objects"`` (object-centred like lego,
the default) and ``"wide"`` (large, for spatial segmentation); see
:mod:`~distnerf.data.synthetic.scenes`.

The package is a standalone generator: it imports nothing from distnerf outside itself.
In particular its rays and ray-primitive intersections are written separately with
numpy, so that a convention bug in distnerf's rays cannot hide by being consistent on
both sides.

Modules
-------
* ``primitives``: the analytic shapes (sphere, box, cylinder, ground plane), their exact
  ray intersection, textures and JSON description.
* ``tracer``: ``look_at``, pixel rays, nearest hit over a scene, Lambertian shading and
  the anti-aliased rendering of one view.
* ``scenes``: :class:`SceneSpec` and the builders of the ``"objects"`` and ``"wide"``
  layouts and cameras.
* ``writer``: the Blender-format files, the scene name and the atomic cache.
* ``cli`` / ``__main__``: the command line.

Conventions
-----------
* World: right-handed, **+Y up** (unlike Blender's Z-up scenes); the ground of ``"wide"``
  is the plane y = 0. Units are arbitrary world units.
* ``c2w`` is camera-to-world, OpenGL convention: the camera looks down its local -Z, +Y
  is up, +X is right (the ``transform_matrix`` of the Blender format).
* Pixel ``(u, v)`` (column, row) has its centre at ``(u + 0.5, v + 0.5)``; focal length
  ``f = 0.5 * W / tan(0.5 * camera_angle_x)`` pixels; 2x2 supersampling, so alpha is
  fractional on silhouettes; straight alpha, RGB 0 where alpha is 0. Details in
  :mod:`~distnerf.data.synthetic.tracer`.

Command line::

    python -m distnerf.data.synthetic --kind wide --resolution 200 --out DIR
"""
from distnerf.data.synthetic.cli import main
from distnerf.data.synthetic.primitives import Box, Cylinder, Sphere
from distnerf.data.synthetic.scenes import SceneSpec
from distnerf.data.synthetic.tracer import render_view
from distnerf.data.synthetic.writer import MARKER, ensure_scene, scene_name

# What the rest of distnerf and the tests use; everything else is in the submodules.
__all__ = ["Box", "Cylinder", "MARKER", "SceneSpec", "Sphere", "ensure_scene", "main",
           "render_view", "scene_name"]
