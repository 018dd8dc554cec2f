"""Along-ray sampling, occupancy grids and volume rendering (pure math, no distributed code)."""
