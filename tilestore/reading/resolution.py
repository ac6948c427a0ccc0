"""How close a level's resolution must be to the one asked for to be read as it is (light:
plans and the command read it without opening anything)."""

from __future__ import annotations

# A level whose mpp is within 2% of the one asked for is used as is: scanners calibrate to
# 0.2499 or 0.5015 um/px, and reading the next finer level for that would cost 4x the pixels.
MPP_TOLERANCE = 0.02
