"""Where a text tower's tokenizer is: the vocabulary files a Hub repo holds beside the
weights (checked before transformers builds a tokenizer without them), or a file the authors
ship in their package and not on the Hub (CONCH's byte-level BPE, MUSK's SentencePiece
model): given, beside the weights, or in the installed package."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tilestore.embed.models.spec import ModelSpec
from tilestore.errors import ModelError

# CONCH's tokenizer file, as its package ships it
CONCH_TOKENIZER = "conch_byte_level_bpe_uncased.json"
# a transformers tokenizer's vocabulary, one of which a folder needs (BPE, SentencePiece, BERT)
VOCABULARIES = ("tokenizer.json", "vocab.json", "spiece.model", "vocab.txt")


def vocabulary(spec: ModelSpec, folder: Path) -> None:
    """One line where a folder has no tokenizer vocabulary: transformers makes a tokenizer of
    the config's kind without one, and every text would be unknown tokens."""
    if not any((folder / f).is_file() for f in VOCABULARIES):
        raise ModelError(
            f"{spec.name}: no tokenizer beside its weights in {folder} (tokenizer.json, "
            f"vocab.json + merges.txt, spiece.model or vocab.txt): `tilestore models pull "
            f"{spec.name}` fetches it, or copy the repo's tokenizer files there"
        )


def packaged_file(
    model: str, folder: Path, given: str | os.PathLike | None, names: tuple[str, ...],
    package: str, inside: str, where: str,
) -> Path:  # fmt: skip
    """A file the authors ship in their package, not on the Hub (a tokenizer): the file
    given, else one of `names` beside the weights, else `inside` the installed `package`
    (found, not imported); ModelError naming `where` it is published otherwise."""
    if given is not None:
        if not Path(given).is_file():
            raise ModelError(f"tokenizer={str(given)!r}: no such file")
        return Path(given)
    for name in names:
        if (folder / name).is_file():
            return folder / name
    found = importlib.util.find_spec(package)
    if found is not None and found.submodule_search_locations:
        for place in found.submodule_search_locations:
            if (Path(place) / inside).is_file():
                return Path(place) / inside
    raise ModelError(
        f"{model}: its tokenizer {names[0]} is not with the weights ({folder}) nor in an "
        f"installed {package} package; give it with tokenizer= (it is in {where})"
    )


def conch_tokenizer_file(folder: Path, given: str | os.PathLike | None) -> Path:
    """CONCH's tokenizer: the file given, else one beside the weights, else the installed
    ``conch`` package's."""
    return packaged_file(
        "conch-v1", folder, given, (CONCH_TOKENIZER, "tokenizer.json"), "conch",
        f"open_clip_custom/tokenizers/{CONCH_TOKENIZER}",
        "github.com/mahmoodlab/CONCH, conch/open_clip_custom/tokenizers/",
    )  # fmt: skip
