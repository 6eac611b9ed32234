"""The error a user's input causes, apart from the bugs a traceback should show."""

import contextlib


class ConfigError(ValueError):
    """Bad input: a key's value, a model, a file or a dataset a command cannot use. The message names the key or
    file and the valid choices; the CLI prints it as one line and exits 2, where anything else raised (a bug) keeps
    its traceback. A ValueError, so ``except ValueError`` still catches it."""


class MissingFileError(ConfigError, FileNotFoundError):
    """A file the user named (``cfg=``, ``matrix=``, ``data=``, a run directory's report) that is not there: a
    :class:`ConfigError` that is also a FileNotFoundError."""


def _one_line(e: BaseException) -> str:
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or repr(e)


@contextlib.contextmanager
def user_input():
    """Inside the block Ultralytics reads what the user named (a model file, a dataset): its errors there, a missing
    file, a malformed YAML or checkpoint, are the user's input and become a :class:`ConfigError` (a
    :class:`MissingFileError` for a missing file), in one line. Outside such blocks an exception is a bug and keeps
    its traceback."""
    try:
        yield
    except ConfigError:
        raise
    except FileNotFoundError as e:
        raise MissingFileError(_one_line(e)) from e
    except (SyntaxError, AssertionError, ValueError, KeyError, RuntimeError) as e:
        raise ConfigError(_one_line(e)) from e
