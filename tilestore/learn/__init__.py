"""Models trained on stored features: from a cohort's embeddings to findings (issue 65).

`models` (the registry of MIL and vector models: `make_model`, `MODELS`), `losses`
(`loss_for`: cross-entropy per head, MSE, Cox partial likelihood). torch is imported only
by the modules that train or run a model, never by this face.

>>> model = make_model("abmil", in_dim=1024, outputs=2)
>>> loss = loss_for(task)
"""

from __future__ import annotations

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.learn.losses": ("loss_for",),
        "tilestore.learn.models": ("MODELS", "ModelSpec", "make_model"),
        "tilestore.learn.models.base": ("BagOutput",),
        "tilestore.learn.task": ("Task",),
    },
)
