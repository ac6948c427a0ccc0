"""The analysis options a user sets (k-means clusters, principal components), declared once
(`tilestore.options`) for the `ds.tiles` accessor, the viewer and the exports' flags. Light:
no scikit-learn."""

from __future__ import annotations

from typing import Annotated

from tilestore.options import Opt

MAX_CLUSTERS = 1_000  # more clusters than a person can look at, or a k-means fit in minutes
MAX_COMPONENTS = 1_024  # wider than any model's features
# the defaults: PCs the exports cluster in and QuPath measures (a few carry most of a
# foundation model's variance over one slide), and clusters where none are asked for
PCS = 5
CLUSTERS = 6

Clusters = Annotated[
    int,
    Opt("k-means clusters.", low=2, high=MAX_CLUSTERS),
]
OptionalClusters = Annotated[
    int | None,
    Opt("k-means clusters to compute and attach.", low=2, high=MAX_CLUSTERS, none="none"),
]
Components = Annotated[
    int,
    Opt("Principal components.", low=1, high=MAX_COMPONENTS),
]
OptionalComponents = Annotated[
    int | None,
    Opt(
        "Principal components: the k-means space (and QuPath's measurements).",
        low=1,
        high=MAX_COMPONENTS,
        none="none: the features themselves",
        none_word="none",
    ),
]
Sample = Annotated[
    int,
    Opt(
        "Tiles a fit sees at most (a random sample of them where there are more).",
        low=1,
        high=10**9,
        cli=False,
    ),
]
Seed = Annotated[
    int, Opt("Seed of the random sample and of the fit.", low=0, high=2**32 - 1, cli=False)
]
