"""The exceptions and warnings tilestore raises for problems a user can act on, all of them:
one hierarchy, in one place.

Every message names the file, the option or the value, the cause and, where there is one,
the fix. The CLI prints them as one line and exits with code 2; anything else is a bug.
(Exceptions that never reach a user, a GPU decoder's failure the run recovers from, are
the code's own business, beside it.)

    TilestoreError
        OptionError       an option's value it does not allow, or options that contradict
        SlideError        a slide file that cannot be read
        StoreError        a store missing, incomplete, damaged or unwritable
            WriteFailed       a write the file system refused (full, read-only, a path blocked)
            ChunkError        a chunk missing, damaged or out of its place
            NotEmbedded       a store without a model's finished embeddings
            DamagedEmbeddings     embeddings whose arrays disagree or hold NaN
            MixedResults      results of several stores made differently, asked together
            StaleSlideEmbedding   a slide vector of tile features replaced since
            SlideEmbeddingExists  a slide vector computed already
        EmbeddingError    an embeddings group that cannot be written (AlreadyComplete)
            OtherWeights      stored features and a model's other half not of one checkpoint
        PlanError         a plan that cannot be made or found
        AnnotationError   an annotation file that cannot be used
        PatientTableError a table of slides and patients that cannot be used
        LabelError        a labelled cohort that cannot be learnt from (one class, NaN labels...)
            LabelTableError   a clinical or slide table that cannot be read or lacks a column
        ModelError        a model that cannot be found, fetched or run (SlideEncoderError)
        DeviceError       a device the run needs and does not have (CUDA, NVTX, dask-cuda)
        ServerError       a store read where it is that its server did not give: refused, not
                          answering, throttling past its retries, ignoring byte ranges (never
                          the store's damage)
        OutputError       an output that cannot be written where asked
            RunError          a run folder that exists, is unfinished or is of other features
        NotJudged         a slide QC's detectors are not made for
        ViewError, AnalysisError, ExportError   what the viewer, an analysis or an export
                          cannot do with what was asked

    Interrupted (a KeyboardInterrupt, not an error: Ctrl-C or SIGTERM stopped an embedding
                 run; it carries the run's report, what was finished and kept)
"""

from __future__ import annotations


class TilestoreError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class SlideError(TilestoreError):
    """A source slide that cannot be read: not a slide, truncated, corrupt, unsupported."""


class StoreError(TilestoreError):
    """A tilestore store that is missing, incomplete, already present or unwritable."""


class ServerError(TilestoreError):
    """A store read where it is (a bucket's, a web server's) that its server did not give: a
    refusal, no answer, a throttle past its retries, a byte range answered whole. A fact
    about the connection, never about the store: never said to be damage (`status` would
    call a sound store damaged, and a user remake it)."""


class WriteFailed(StoreError):
    """A write into a store that the file system refused: full, over quota, read-only, no
    permission, a path blocked by a file (`tilestore.format.store.writing`). `fault` says
    whose it is (`tilestore.format.store.WriteFault`: the file system's, where every store
    on it would fail alike, or the store's own) and what to do."""

    def __init__(self, message: str, fault: object = None) -> None:
        super().__init__(message)
        self.fault = fault

    def __reduce__(self):  # pickled whole (a Dask worker's error reaches the coordinator)
        return (type(self), (str(self), self.fault))


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


class OptionError(TilestoreError, ValueError):
    """An option's value outside what it allows (`tilestore.options`), or options that
    contradict each other: refused before anything is done."""


class MixedResults(StoreError):
    """Results computed from different things, refused where they would be combined."""


class NotEmbedded(StoreError):
    """A store without this model's finished embeddings (absent or unfinished)."""


class DamagedEmbeddings(StoreError):
    """A finished embeddings group that cannot be what its run wrote: its arrays' shapes
    disagree with its record, or it holds non-finite features (no run writes them)."""


class StaleSlideEmbedding(StoreError):
    """A slide embedding computed from tile features that have been replaced since."""


class SlideEmbeddingExists(StoreError):
    """The store holds this encoder's slide embedding already (skipped unless overwrite)."""


class EmbeddingError(TilestoreError):
    """An embeddings group that cannot be written: done already, locked, or incompatible."""


class AlreadyComplete(EmbeddingError):
    """The store holds this model's finished embeddings: skipped unless overwrite=True."""


class OtherWeights(EmbeddingError):
    """Stored features that are not known to come from the weights a model's other half was
    read from (zero-shot's text tower): scoring them together would be a silent wrong
    answer."""


class ModelError(TilestoreError):
    """A model that cannot be found, fetched, built or run."""


class SlideEncoderError(ModelError):
    """A slide encoder that cannot be used on these tile features."""


class PatientTableError(TilestoreError):
    """A table of slides and their patients that cannot be used (a column missing, a slide
    in two patients, a slide no store holds...)."""


class LabelError(TilestoreError):
    """A labelled cohort that cannot be learnt from (`tilestore.learn`): labels of one class,
    NaN labels, survival times <= 0, events not 0/1, a patient without slides, no stores, a
    splits file that does not fit the cohort."""


class LabelTableError(LabelError):
    """A clinical or slide table that cannot be read, or lacks a column it is asked for."""


class DeviceError(TilestoreError):
    """A device or library a run needs and this machine does not have (CUDA, NVTX,
    dask-cuda)."""


class OutputError(TilestoreError):
    """An output that cannot be written where it was asked (a folder, a file there)."""


class RunError(OutputError):
    """A trained run's folder that cannot be used as asked: one that exists where a new run
    would be written, one unfinished, or one of other features than the stores given."""


class ViewError(TilestoreError):
    """A viewer request for something the served stores do not hold."""


class AnalysisError(TilestoreError):
    """An analysis request that does not fit the data (no such slide, k too large...)."""


class Interrupted(KeyboardInterrupt):
    """An embedding run stopped by a signal (Ctrl-C, SIGTERM: the signal's name is its
    message), raised once what was done is kept; `report` is the run's report, with the
    stores it finished and the tiles kept of those it had not."""

    def __init__(self, signal: str, report) -> None:
        super().__init__(signal)
        self.report = report


class TilestoreWarning(UserWarning):
    """Something was done that the user should know about (missing mpp, repaired polygons)."""
