"""What lies on the glass: tissue masks (`tissue`, stored as labels/tissue), the tutorials'
contrast rule (`contrast`) and hole filling by one labelling (`holes`), for planning and QC.

May import: `tilestore.reading`, `tilestore.format`.
"""

from __future__ import annotations

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.masks.contrast": ("ContrastRule", "passes"),
        "tilestore.masks.holes": ("fill_holes",),
        "tilestore.masks.options": ("TISSUE_MPP", "TissueMethod", "TissueMpp"),
        "tilestore.masks.tissue": (
            "TissueMask",
            "compute_tissue",
            "read_tissue",
            "write_tissue",
        ),
    },
)
