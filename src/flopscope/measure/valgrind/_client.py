"""Valgrind client requests issued from Python, without a C compiler.

Valgrind recognises a "client request" by a special instruction sequence that is a no-op on a
real CPU: four rotations of ``rdi`` by 3, 13, 61 and 51 bits (128 bits in total, so ``rdi`` is
unchanged) followed by ``xchg rbx, rbx``.  ``rax`` points at six 64-bit words (request code and five
arguments) and the result comes back in ``rdx``.  This ABI is documented in ``valgrind.h``
(``VALGRIND_DO_CLIENT_REQUEST_EXPR`` for amd64); the request codes below come from
``callgrind.h`` (``VG_USERREQ_TOOL_BASE('C', 'T')`` and the enum after it).

We place those bytes in an executable page with ``mmap`` and call them through ``ctypes``.
Outside valgrind every request returns its default value and does nothing.
"""

from __future__ import annotations

import ctypes
import mmap
import platform

__all__ = [
    "CALLGRIND_DUMP_STATS_AT",
    "CALLGRIND_START_INSTRUMENTATION",
    "CALLGRIND_STOP_INSTRUMENTATION",
    "CALLGRIND_ZERO_STATS",
    "STUB_CODE",
    "ClientRequests",
]

_TOOL_BASE_CT = (ord("C") << 24) | (ord("T") << 16)
CALLGRIND_DUMP_STATS = _TOOL_BASE_CT + 0
CALLGRIND_ZERO_STATS = _TOOL_BASE_CT + 1
CALLGRIND_DUMP_STATS_AT = _TOOL_BASE_CT + 3
CALLGRIND_START_INSTRUMENTATION = _TOOL_BASE_CT + 4
CALLGRIND_STOP_INSTRUMENTATION = _TOOL_BASE_CT + 5
# Core request (valgrind.h): returns the number of valgrind layers we run under, 0 natively.
VG_USERREQ_RUNNING_ON_VALGRIND = 0x1001

# uint64 stub(uint64 *args, uint64 default):
STUB_CODE = bytes.fromhex(
    "4889f8"  # mov rax, rdi      ; rax -> args
    "4889f2"  # mov rdx, rsi      ; rdx = default result
    "48c1c703"  # rol rdi, 3
    "48c1c70d"  # rol rdi, 13
    "48c1c73d"  # rol rdi, 61
    "48c1c733"  # rol rdi, 51
    "4887db"  # xchg rbx, rbx     ; the request itself
    "4889d0"  # mov rax, rdx
    "c3"  # ret
)

_StubType = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint64)


class ClientRequests:
    """Callable stub issuing valgrind client requests (amd64 Linux only).

    Raises:
        OSError: if the platform is not x86-64 or an executable page cannot be mapped.
    """

    def __init__(self) -> None:
        if platform.machine() not in ("x86_64", "AMD64"):
            raise OSError(
                f"valgrind client requests are implemented for x86-64 only, not {platform.machine()}"
            )
        self._page = mmap.mmap(
            -1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
        )
        self._page.write(STUB_CODE)
        buf = ctypes.c_char.from_buffer(self._page)
        self._addr = ctypes.addressof(buf)
        del buf
        self._fn = _StubType(self._addr)
        self._keep: list[ctypes.Array[ctypes.c_char]] = []

    def request(self, code: int, *args: int, default: int = 0) -> int:
        """Issue one client request.

        Args:
            code: the request code.
            *args: up to five integer arguments.
            default: the value returned when not running under valgrind.

        Returns:
            The request's result (``default`` natively).
        """
        words = (ctypes.c_uint64 * 6)(code, *(list(args) + [0] * (5 - len(args))))
        return int(self._fn(words, default))

    def running_on_valgrind(self) -> int:
        """Returns: the number of valgrind layers (0 when running natively)."""
        return self.request(VG_USERREQ_RUNNING_ON_VALGRIND, default=0)

    def dump_stats_at(self, label: str) -> None:
        """Ask callgrind to write (and zero) its counts now, tagged with ``label``.

        Args:
            label: text that appears in the dump's ``desc: Trigger:`` line.
        """
        text = ctypes.create_string_buffer(label.encode())
        self._keep.append(text)
        self.request(CALLGRIND_DUMP_STATS_AT, ctypes.addressof(text))

    def start_instrumentation(self) -> None:
        """Start callgrind's instrumentation (counting resumes)."""
        self.request(CALLGRIND_START_INSTRUMENTATION)

    def stop_instrumentation(self) -> None:
        """Stop callgrind's instrumentation (the program runs at near-native valgrind speed)."""
        self.request(CALLGRIND_STOP_INSTRUMENTATION)

    def zero_stats(self) -> None:
        """Zero callgrind's counts."""
        self.request(CALLGRIND_ZERO_STATS)
