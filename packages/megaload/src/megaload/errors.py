"""The exceptions megaload raises.

Every error derives from :class:`MegaloadError` and from the builtin that fits it, so callers
that already catch ``ValueError`` (or ``RuntimeError``, ``LookupError``) keep working. Messages
name the argument or field, what was expected and what was found.
"""

from __future__ import annotations

from megafmt import PluginError
from megafmt.redaction import RedactedMessage


class MegaloadError(RedactedMessage, Exception):
    """Base class of every error raised by megaload (its message never shows credentials)."""


class SamplerError(MegaloadError, ValueError):
    """A sampler or loader cannot be built with these arguments."""


class ResumeError(SamplerError):
    """A saved loader state cannot be resumed by this loader: another dataset, sampler, or a
    layout the sampler's resume rules refuse."""


class LoaderStateError(ResumeError):
    """A saved loader state is malformed: a key is missing, or holds a value of the wrong type
    or an unknown version (the message names the key, the value and what is allowed)."""


class SamplerTypeError(SamplerError, TypeError):
    """A count given to a sampler or loader is not an integer (``consumed_samples=12.7``);
    a ``TypeError`` too, as Megatron-LM's samplers fail with one there."""


class BackfillError(ResumeError, AssertionError):
    """A checkpoint's missing consumed-sample counts cannot be inferred (a sample-based run);
    an ``AssertionError`` too, as Megatron-LM asserts there."""


class SamplerPluginError(MegaloadError, PluginError):
    """A ``megaload.samplers`` plugin built something that is not a batch sampler."""


class NoDataError(MegaloadError, RuntimeError):
    """A loader that is read again and again yields nothing at all."""


class PhaseDataError(NoDataError):
    """A phase of a :class:`~megaload.phases.PhasedDataLoader` other than the last ran out of
    samples before its last iteration (the message names the phase, the iteration and the
    samples it needs)."""


class WorkerDiedError(MegaloadError, RuntimeError):
    """A DataLoader worker process died (killed, crashed): the message names the loader's split,
    its dataset, where in the samples it was and the likely causes; torch's names the pid."""


class SimulationError(MegaloadError, ValueError):
    """``mega load simulate`` lacks an argument it needs, or found ranks that read the same
    samples or a sequential global batch that is not one block."""


class SchedulingError(MegaloadError, ValueError):
    """Hybrid context parallelism cannot deal a global batch's sub-sequences to the ranks (one
    needs more ranks than there are, or the seed commit's rule would drop work)."""
