"""Procedural default scenes, rendered analytically: object scenes and aerial cities.

Legend: N rays (one per sub-pixel sample), H, W image size in pixels, V views of a split
or of a city's flight, K primitives of a scene, P 3D points.

With no dataset given, distnerf trains on a scene that it generates itself:
:func:`ensure_scene` renders it once into a cache directory and every later call (from
any rank) reuses it. Four kinds of scene (see :mod:`~distnerf.data.synthetic.scenes`):

* ``"objects"`` (the default, object-centred like lego), in the nerf_synthetic
  ("Blender") layout with transparent background (see
  :mod:`~distnerf.data.synthetic.writer`);
* ``"detail"`` (one sphere under a band-limited texture, 100 train views of 200 x 200: a
  scene whose quality grows with a model's parameters, for the capacity study), in the
  same layout;
* ``"city_small"`` (3 x 3 blocks, 60 views of 100 x 75 by default: trains on one CPU)
  and ``"city"`` (8 x 8 blocks, 245 views of 160 x 120, the benchmark size): aerial
  nadir and oblique views of box buildings on a textured ground under a sky (opaque
  images), with per-image exposure and white balance; all images in ``images/``,
  described in three formats (Blender, nerfstudio ``transforms.json``, COLMAP text
  model in a known random similarity frame), see :mod:`~distnerf.data.synthetic.formats`.

The package is a standalone generator: it imports nothing from distnerf outside itself.
In particular its rays and ray-primitive intersections are written separately with
numpy, so that a convention bug in distnerf's rays cannot hide by being consistent on
both sides.

Modules
-------
* ``primitives``: the analytic shapes (sphere, box, cylinder, ground plane, the city's
  building and ground), their exact ray intersection, textures, surface sampling and
  JSON description.
* ``tracer``: ``look_at``, pixel rays, nearest hit over a scene, Lambertian shading, the
  sky and the anti-aliased rendering of one view.
* ``scenes``: :class:`SceneSpec`, the city's cameras and flight (``Survey``), image
  sizes, view counts and the builders of the four kinds.
* ``formats``: a city's images, Blender, nerfstudio and COLMAP files, and its 3D points
  with their visibility.
* ``writer``: the objects' Blender files, the scene name and the atomic cache.
* ``cli`` / ``__main__``: the command line.

Conventions
-----------
* World: right-handed, **+Y up** (unlike Blender's Z-up scenes); the cities' ground is
  the plane y = 0. Units are arbitrary world units.
* ``c2w`` is camera-to-world, OpenGL convention: the camera looks down its local -Z, +Y
  is up, +X is right (the ``transform_matrix`` of the Blender and nerfstudio formats;
  COLMAP's poses are world-to-camera in the OpenCV frame, in their own world frame).
* Pixel ``(u, v)`` (column, row) has its centre at ``(u + 0.5, v + 0.5)``; objects:
  focal length ``f = 0.5 * W / tan(0.5 * camera_angle_x)`` pixels, principal point at
  the centre; cities: per-image ``fl_x, fl_y, cx, cy`` of their two cameras. 2x2
  supersampling, so the objects' alpha is fractional on silhouettes; straight alpha, RGB
  0 where alpha is 0. Details in :mod:`~distnerf.data.synthetic.tracer`.
* ``resolution`` is the image width (objects: square images; cities: 4:3); unset, the
  kind's default (objects 100, detail 200, city_small 100, city 160).

Command line::

    python -m distnerf.data.synthetic --kind city_small --out DIR
"""
from distnerf.data.synthetic.cli import main
from distnerf.data.synthetic.primitives import Box, Cylinder, Sphere
from distnerf.data.synthetic.scenes import SceneSpec
from distnerf.data.synthetic.tracer import render_view
from distnerf.data.synthetic.writer import MARKER, ensure_scene, scene_name

# What the rest of distnerf and the tests use; everything else is in the submodules.
__all__ = ["Box", "Cylinder", "MARKER", "SceneSpec", "Sphere", "ensure_scene", "main",
           "render_view", "scene_name"]
