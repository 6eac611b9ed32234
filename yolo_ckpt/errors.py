"""The error a user's input causes, apart from the bugs a traceback should show."""

import contextlib
import pickle
from pathlib import Path


class ConfigError(ValueError):
    """Bad input: a key's value, a model, a file or a dataset a command cannot use. The message names the key or
    file and the valid choices; the CLI prints it as one line and exits 2, where anything else raised (a bug) keeps
    its traceback. A ValueError, so ``except ValueError`` still catches it."""


class MissingFileError(ConfigError, FileNotFoundError):
    """A file the user named (``cfg=``, ``matrix=``, ``data=``, a run directory's report) that is not there: a
    :class:`ConfigError` that is also a FileNotFoundError."""


class FinishedRunError(ConfigError, AssertionError):
    """``resume`` of a run that cannot go on (its ``last.pt`` stripped, or saved at its last epoch): a
    :class:`ConfigError` that is also the AssertionError stock raises there (``BaseTrainer.resume_training``'s
    ``assert 0 < start_epoch < epochs``), so code written for stock still catches it."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, ``kill``) inside a trainer: raised as Ctrl-C's KeyboardInterrupt is, so that what
    stops a run on Ctrl-C stops it the same way (:func:`yolo_ckpt.train.resume.stop_on_interrupt`); the CLI exits
    143 (128 + SIGTERM)."""


class NoRoomError(OSError):
    """A checkpoint that does not fit on its disk (``ENOSPC``) or under the file-size limit (``EFBIG``,
    ``ulimit -f``), with no earlier file that an in-place write could reuse: nothing torn is left. Its message, one
    line, says how many bytes the save needs; ``errno`` is the write's."""


def one_line(text) -> str:
    """``text``'s (an exception's) non-blank lines joined by "; " (Ultralytics' errors span several lines)."""
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip()) or repr(text)


def _yaml_layer(error: BaseException) -> str | None:
    """``layer 0 (Conv ['abc', 3, 2])``: the model YAML row Ultralytics' ``parse_model`` was building when ``error``
    was raised (its frame's loop variables), or None where the error did not come from ``parse_model``."""
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "parse_model" and frame.f_globals.get("__name__") == "ultralytics.nn.tasks" and "i" in frame.f_locals:
            module = frame.f_locals.get("m")
            return f"layer {frame.f_locals['i']} ({getattr(module, '__name__', module)} {frame.f_locals.get('args')})"
        tb = tb.tb_next
    return None


@contextlib.contextmanager
def user_input(checkpoint=None):
    """Inside the block Ultralytics reads what the user named (a model file, a dataset): its errors there, a missing
    file, a malformed YAML or checkpoint, are the user's input and become a :class:`ConfigError` (a
    :class:`MissingFileError` for a missing file), in one line. Outside such blocks an exception is a bug and keeps
    its traceback.

    Args:
        checkpoint: the ``model=`` a block loads: where it names a ``.pt`` file, what loading a file that is not an
            Ultralytics checkpoint raises (``torch_load``'s TypeError, an unpickling error) names it too.

    Raises:
        ConfigError: as above; for a TypeError or IndexError raised while Ultralytics' ``parse_model`` builds a model
            YAML's layers (a row's arguments of the wrong type), naming ``checkpoint``, the layer and its row.
    """
    try:
        yield
    except ConfigError:
        raise
    except FileNotFoundError as e:
        raise MissingFileError(one_line(e)) from e
    except (SyntaxError, AssertionError, ValueError, KeyError, RuntimeError) as e:
        raise ConfigError(one_line(e)) from e
    except (TypeError, IndexError, EOFError, ModuleNotFoundError, AttributeError, pickle.UnpicklingError) as e:
        if (layer := _yaml_layer(e)) is not None:  # a model YAML's row parse_model cannot build (a string channel count)
            raise ConfigError(f"model={checkpoint or 'the model YAML'} {layer} cannot be built: {one_line(e)}") from None
        if isinstance(e, IndexError) or not (str(checkpoint).lower().endswith(".pt") and Path(str(checkpoint)).is_file()):
            raise
        reason = one_line(str(e).replace("ERROR ❌️", "")).split("; Recommended")[0]
        raise ConfigError(f"model={checkpoint} is not a loadable Ultralytics checkpoint: {reason}") from None
