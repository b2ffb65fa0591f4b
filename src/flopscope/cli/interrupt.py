"""Ctrl-C on the command line: whenever it arrives (while Python imports torch, while a model
loads or counts, while a table is written, while worker processes run, while the interpreter
shuts down), the command exits 130 with one line on stderr.

A :class:`KeyboardInterrupt` raised at an arbitrary point can be lost or do harm: swallowed by
code that catches every exception, turned into a C++ ``std::terminate`` (exit -6) when it is
raised inside an extension module's initialisation (torch's pybind11 code), printed as
"Exception ignored in ..." when raised in a weakref callback or an exit handler, or it leaves a
module half imported so that a later error (a ``RecursionError``) hides it. So:

- :func:`install` replaces Python's SIGINT handler as early as ``python -m flopscope`` can. The
  first SIGINT raises :class:`KeyboardInterrupt` as usual (a subcommand may keep what it
  finished, as ``zoo`` keeps its rows), except while an installed library (torch) is imported,
  an extension module initialises or a worker process is being started: then it is delivered
  again a moment later, until that is done (a second or two for torch). SIGINTs that follow within :data:`REPEAT_WINDOW` seconds
  (an impatient second Ctrl-C, ``timeout -s INT``'s burst) are ignored, so that the first
  one's cleanup is not itself interrupted into a traceback. An interrupt that was raised but
  swallowed (the command still runs :data:`REPEAT_WINDOW` seconds later), or raised where Python
  cannot pass it on (a weakref callback), is delivered again.
- :func:`flopscope.cli.main` reports an error that follows an interrupt as the interrupt.
- :func:`finish` ends the process: with 130 and the one line when an interrupt arrived but the
  command's exit code does not say so; from then on a SIGINT during the interpreter's shutdown
  (joining a worker pool's threads, exit handlers) exits 130 at once. Once every exit handler
  has run, everything is written and cleaned up: a SIGINT during the interpreter's teardown that
  follows is ignored, and the command's own exit code stands.
- :func:`restore` gives back the handlers :func:`install` took, for a process that goes on
  (an in-process test of ``main_entry``).

Before flopscope's first line runs (Python's own start-up, some 50 ms) nothing can be done: a
SIGINT then ends Python as Python does.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, NoReturn

__all__ = ["EXIT_INTERRUPTED", "REPEAT_WINDOW", "finish", "install", "interrupted", "restore",
           "say"]

EXIT_INTERRUPTED = 130
"""The exit code of an interrupted command (as :data:`flopscope.cli._options.EXIT_INTERRUPTED`)."""

REPEAT_WINDOW = 2.0
"""Seconds after a raised interrupt during which more SIGINTs are ignored (it is unwinding);
if the command still runs after them, the interrupt was swallowed and is raised again."""

_RETRY = 0.02  # seconds: how soon a SIGINT put off while a library is imported returns
_LIBRARIES: tuple[str, ...] = ()  # folders of installed packages (set by install())

_raised: list[float] = []  # when the interrupt was raised, each time (empty: never)
_exit_code: list[int] = []  # the exit code, once finish() has been called
_installed: list[Any] = []  # the SIGINT handler found at install (empty: not installed)
_epoch = [0]  # counts restore(): a SIGINT planned before one is not sent
_default_unraisable: list[Any] = []  # Python's sys.unraisablehook, for what is not an interrupt


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    now = time.monotonic()
    if _raised and now - _raised[-1] < REPEAT_WINDOW:
        return  # the interrupt is unwinding: do not interrupt its cleanup
    if _importing_library(frame):
        _deliver_again(_RETRY)  # raised here, C++ may terminate the process
        return
    _raised.append(now)
    _deliver_again(REPEAT_WINDOW, unless_finished=True)  # in case it is swallowed
    raise KeyboardInterrupt


def _importing_library(frame: FrameType | None) -> bool:
    """Whether the main thread is importing an installed library or initialising an extension
    module: code that calls C++ which calls Python back (torch's ``_c10d_init``, pybind11
    module set-up), where an exception raised may not propagate and terminates the process; or
    starting a worker process (multiprocessing's ``_launch``), where an interrupt between the
    spawn and the start-up message leaves a child that prints an ``EOFError`` traceback."""
    while frame is not None:
        code = frame.f_code
        if (code.co_name == "<module>" and code.co_filename.startswith(_LIBRARIES)
                and _imported(frame)):
            return True
        if (code.co_filename.startswith("<frozen importlib")
                and code.co_name in ("create_module", "exec_module")
                and type(frame.f_locals.get("self")).__name__ == "ExtensionFileLoader"):
            return True
        if code.co_name == "_launch" and os.path.basename(
                os.path.dirname(code.co_filename)) == "multiprocessing":
            return True
        frame = frame.f_back
    return False


def _imported(frame: FrameType) -> bool:
    """Whether a module's code runs because it is imported (called by the import machinery), not
    as the program (``python -m``'s ``__main__`` or pytest's, run by runpy: an installed
    package's ``__main__`` is at the bottom of every stack while the command runs)."""
    caller = frame.f_back
    return caller is not None and caller.f_code.co_filename.startswith("<frozen importlib")


def _deliver_again(delay: float, *, unless_finished: bool = False) -> None:
    """Send SIGINT to this process again after ``delay`` seconds, from another thread, so that
    it is raised in the command's own code; with ``unless_finished``, only if the command has
    not reached :func:`finish` by then (the interrupt was swallowed)."""

    epoch = _epoch[0]

    def send() -> None:
        time.sleep(delay)
        if epoch != _epoch[0] or (unless_finished and _exit_code):
            return  # restored since (see restore), or finished
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=send, daemon=True).start()


def _on_unraisable(info: Any) -> None:
    """A KeyboardInterrupt raised where Python cannot pass it on (a weakref callback, a
    ``__del__``) would be printed as "Exception ignored in ..." and lost: deliver the SIGINT
    again instead. Anything else goes to Python's hook."""
    if info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt):
        _raised.clear()  # not a repeat: it never reached the command
        _deliver_again(0.0)
        return
    _default_unraisable[0](info)


def _on_sigint_at_exit(signum: int, frame: FrameType | None) -> None:
    """A SIGINT while the interpreter shuts down: the work is done and written, so exit 130 now
    (one line, unless the interrupt was already reported). A SIGINT within
    :data:`REPEAT_WINDOW` of the interrupt that ended the command is the same burst: ignored,
    so that the shutdown's own cleanup (a worker pool's semaphores) still runs."""
    if _raised and time.monotonic() - _raised[-1] < REPEAT_WINDOW:
        return
    if not _exit_code or _exit_code[0] != EXIT_INTERRUPTED:
        say()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(EXIT_INTERRUPTED)


def _ignore_at_teardown() -> None:
    """The last exit handler: from here the interpreter tears itself down (and would restore
    SIGINT's default action, death by signal) after everything was written and cleaned up, so
    a SIGINT is ignored and the command's own exit code stands."""
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _forget_escaped_interrupt() -> None:
    """CPython remembers a KeyboardInterrupt that escaped code an extension ran through
    ``PyRun_String`` (torch's import runs such code through pybind11), and at the end of
    ``python -m`` it then kills itself with SIGINT (exit -2) instead of exiting with the code
    given. Running an empty statement through the same function clears what it remembered."""
    if sys.implementation.name != "cpython":
        return
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"")


def say() -> None:
    """Print the one line of an interrupted command, ``flopscope: interrupted``, on stderr
    (nothing if stderr is closed); it imports nothing, so it works at any moment."""
    with contextlib.suppress(OSError, ValueError):  # stderr closed
        print("flopscope: interrupted", file=sys.stderr, flush=True)


def install() -> None:
    """Handle SIGINT as the module docstring says (from the main thread; idempotent). The
    handler is set last, so that a SIGINT while this prepares goes to the handler before it.
    :func:`restore` gives back what this took over (for a caller that goes on running)."""
    if threading.current_thread() is not threading.main_thread():
        return  # Python's own handling stays
    if not _installed:
        global _LIBRARIES
        import sysconfig

        paths = sysconfig.get_paths()
        _LIBRARIES = tuple({os.path.join(paths[k], "") for k in ("purelib", "platlib")
                            if k in paths})
        _installed.append(signal.getsignal(signal.SIGINT))
        atexit.register(_ignore_at_teardown)  # the first registered runs last
        _default_unraisable.append(sys.unraisablehook)
        sys.unraisablehook = _on_unraisable
    signal.signal(signal.SIGINT, _on_sigint)


def restore() -> None:
    """Undo :func:`install` in a process that goes on running (an in-process test of
    ``main_entry``): the SIGINT handler and ``sys.unraisablehook`` found at install are put
    back, the exit handler removed, and what this module remembered is forgotten."""
    if not _installed:
        return
    previous = _installed.pop()
    with contextlib.suppress(ValueError, TypeError):  # not the main thread; None (set in C)
        signal.signal(signal.SIGINT, previous)
    atexit.unregister(_ignore_at_teardown)
    if sys.unraisablehook is _on_unraisable:
        sys.unraisablehook = _default_unraisable[0]
    for state in (_default_unraisable, _raised, _exit_code):
        state.clear()
    _epoch[0] += 1


def interrupted() -> bool:
    """Whether an interrupt has been raised since :func:`install`.

    Returns:
        Whether one was.
    """
    return bool(_raised)


def finish(code: int) -> NoReturn:
    """Exit with ``code``, or with 130 and the one line when an interrupt was raised and the
    code does not say so (it was lost on the way); a SIGINT from here on exits 130 at once.

    Args:
        code: the command's exit code.

    Raises:
        SystemExit: always.
    """
    lost = interrupted() and code != EXIT_INTERRUPTED
    if lost:
        code = EXIT_INTERRUPTED
    _exit_code.append(code)
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGINT, _on_sigint_at_exit)
    if lost:
        say()
    if interrupted():
        _forget_escaped_interrupt()
    sys.exit(code)
