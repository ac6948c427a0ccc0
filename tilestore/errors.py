"""The exceptions and warnings tilestore raises for problems a user can act on.

Every message names the file, the cause and, where there is one, the fix. The
CLI prints them as one line and exits with code 2; anything else is a bug.
"""

from __future__ import annotations


class TilestoreError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class SlideError(TilestoreError):
    """A source slide that cannot be read: not a slide, truncated, corrupt, unsupported."""


class StoreError(TilestoreError):
    """A tilestore store that is missing, incomplete, already present or unwritable."""


class NotJudged(TilestoreError):
    """A slide QC's detectors are not made for (fluorescence, other channels than RGB, scanned
    coarser than the maps): a fact about the slide, reported as such, not a failure."""


class ChunkError(StoreError):
    """A store chunk that is missing, truncated, corrupt or not a regular file."""


class AnnotationError(TilestoreError):
    """An annotation file that cannot be used as a region of interest."""


class PlanError(TilestoreError):
    """A tile plan that cannot be made or found."""


class ExportError(TilestoreError):
    """An export that cannot be written as asked (e.g. a file type it does not write)."""


class TilestoreWarning(UserWarning):
    """Something was done that the user should know about (missing mpp, repaired polygons)."""
