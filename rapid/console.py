"""What a run prints. The console shows rapid's own lines: the run directory, the config line, the progress
bar, the evaluations, the summary, and rapid's warnings and errors. What the libraries say on the way goes to
the run's log file (<run_dir>/train.log) instead: vLLM's start-up and per-round warnings, the engine's C++
warnings, other packages' FutureWarnings and DeprecationWarnings, transformers' progress bars. An error
(level ERROR and above) from any library still reaches the console. `logger.verbose=true` leaves every
library's output on the console, as the libraries print it.

    quiet_libraries(log_file, verbose)   once, before the model and the engine are built
    with engine_start(log_file, verbose): ...   around the engine's construction (its C++ lines go to stderr)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path

RAPID = Path(__file__).resolve().parent  # rapid's own code
OWN = ("rapid", "__main__")  # loggers whose lines are rapid's


def from_rapid(filename: str) -> bool:
    """Whether a warning raised at `filename` comes from rapid's own code (its stacklevel points there)."""
    try:
        return Path(filename).resolve().is_relative_to(RAPID)
    except (OSError, ValueError):
        return False


class RapidOnly(logging.Filter):
    """The console's filter: rapid's records, and any library's errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or record.name.split(".")[0] in OWN


def log_file_of(run_dir: Path) -> Path:
    """The run's log file: the one Hydra's job logging writes (<run_dir>/<job name>.log), else <run_dir>/train.log."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            return Path(handler.baseFilename)
    return Path(run_dir) / "train.log"


def quiet_libraries(log_file: Path, verbose: bool) -> None:
    """Route the libraries' output to `log_file` and keep the console to rapid's lines (module docstring).
    With `verbose` nothing changes. Call once per process, before vLLM is imported."""
    if verbose:
        return
    root = logging.getLogger()
    if not any(isinstance(h, logging.FileHandler) for h in root.handlers):  # not under Hydra's job logging
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        root.addHandler(logging.FileHandler(log_file, delay=True))
    for handler in root.handlers:
        if not isinstance(handler, logging.FileHandler) and not any(isinstance(f, RapidOnly) for f in handler.filters):
            handler.addFilter(RapidOnly())
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    # vLLM's records to the root logger's handlers (the log file), not to its own console handler. vLLM
    # configures its logging when it is first imported; once it is, its own handlers get the same filter.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    if "vllm" in sys.modules:
        for handler in logging.getLogger("vllm").handlers:
            handler.addFilter(RapidOnly())
    try:  # transformers: its records through the root's handlers, no progress bars for loading and saving
        from transformers.utils import logging as hf_logging

        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    original = warnings.showwarning
    if getattr(original, "rapid_console", False):  # installed by an earlier run of this process (multirun)
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if from_rapid(filename):
            return original(message, category, filename, lineno, file, line)
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
        logging.getLogger("py.warnings").warning(text)

    show.rapid_console = True
    warnings.showwarning = show


@contextlib.contextmanager
def engine_start(log_file: Path, verbose: bool):
    """The process's stderr (file descriptor 2) into `log_file` while the inference engine starts: vLLM's
    C++ code writes its warnings there directly (NUMA binding, thread binding), past Python's logging.
    Python's own lines (rapid's, the filtered log records) are written to stdout and are not affected."""
    if verbose:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
