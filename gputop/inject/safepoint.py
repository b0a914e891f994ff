"""Run one line of Python inside a live CPython 3.10-3.13 process, started from a thread parked at a safe point.

This is the tracer.  It runs in a helper process of its own (``python -m gputop.inject.safepoint``), so
that gputop itself never sits inside ptrace and a deadline always holds: gputop kills the helper past it,
and killing the helper at any moment leaves the job running (see "Why a kill is harmless" below).

Why not hijack whatever the thread is doing (what pyinjector does): a thread stopped inside the allocator
holds its lock, and the injected call needs that lock (the job froze for good); a thread stopped inside
torch's C++ keeps values in SSE/AVX registers, which the injected call clobbers and pyinjector does not
restore (only the general registers), so the job crashed later.  Here:

1. **Safe point.**  Every thread's ``/proc/PID/task/TID/syscall`` is read without stopping anything.  A
   thread blocked in a syscall that the interpreter or a runtime issues with the GIL released and no libc
   lock held is a candidate: ``nanosleep``/``clock_nanosleep`` (``time.sleep``), ``poll``/``select``/
   ``epoll_wait`` (queues, sockets, the CUDA driver's threads), ``read`` on a pipe or socket, ``accept``,
   and a ``futex`` wait whose word lies outside libc's, libpthread's, ld.so's and the interpreter's memory
   (those words are the allocator's, stdio's and the loader's own locks, and the GIL).  The best candidate is stopped with
   ``PTRACE_SEIZE`` + ``PTRACE_INTERRUPT`` and checked again from its registers in that same stop; a thread
   that moved on is let go untouched, and the next one is tried; a round that finds none waits a few
   milliseconds.  No safe thread within the bound: a one-line refusal, never a risky try.
2. **The call.**  The borrowed thread only starts a native thread (``malloc``, ``pthread_create``) and
   goes back to its syscall; that new thread runs ``PyGILState_Ensure(); PyRun_SimpleStringFlags(code,
   NULL); PyGILState_Release()`` (the C API any C library's callback thread uses) and ends: no ``dlopen``,
   no file, and the borrowed thread never waits for the GIL.  The control block and the code go on the
   borrowed thread's stack below its red zone; a 302-byte trampoline (``TRAMPOLINE`` below) goes in the
   unused tail of an executable page of libpython (or the python executable, or libc), where no code of
   the process can ever jump, and is the same bytes every time (a second injection finds it in place).
3. **Restore.**  The trampoline saves the whole extended register state (``xsave64``) before the call and
   restores it (``xrstor64``) after, then reloads every general register and jumps back to where the
   thread was parked.  An interrupted syscall is resumed the way the kernel itself would resume it
   (``-ERESTART*``: the syscall is issued again; ``restart_syscall`` for a restart block), so the job sees
   at most the ``EINTR`` that any signal or debugger attach can cause.

Why a kill is harmless: everything the trampoline needs is written before the registers are switched,
and the trampoline restores the thread by itself; no ``int3`` or return to address 0 waits for a tracer.
Killed before the switch, the kernel lets the thread go where it was; killed after, the thread finishes
the call and returns by itself.

x86-64 only; other machines get a one-line refusal (the passive benchmark still runs).
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import errno
import json
import os
import re
import signal
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    from elftools.elf.segments import Segment

# ----------------------------------------------------------------------------------- the trampoline

# Assembled with GNU as (`as --64`, Intel syntax) from TRAMPOLINE_SOURCE; tests/test_safepoint.py checks the
# bytes against a fresh assembly where `as` is installed.  The borrowed thread enters at 0 with rbx holding
# the control block's address and rsp a 16-byte aligned scratch stack below it.  It only starts a native
# thread (malloc, pthread_create) and goes back: the Python runs on that new thread (`thread_main`), which
# takes the GIL as any new thread does.  Running it on the borrowed thread itself froze jobs: a thread
# parked in a condition variable that another thread signals while holding the GIL (or the GIL's mutex)
# must wake before that signaller can go on, and a borrowed thread waiting for the GIL never does.
TRAMPOLINE_SOURCE = """
.intel_syntax noprefix
    mov qword ptr [rbx+32], 1          # state: started (from here the thread finishes alone)
    mov eax, -1
    mov edx, -1
    xsave64 [rbx+256]                  # x87/SSE/AVX/AVX-512 state, as the parked code left it
    mov qword ptr [rbx+40], -1         # result: -1 until pthread_create answers
    mov rdi, qword ptr [rbx+24]
    call qword ptr [rbx+0]             # malloc(thread block size)
    test rax, rax
    jz 1f
    mov r12, rax
    mov rdi, rax
    mov rsi, qword ptr [rbx+184]
    mov rcx, qword ptr [rbx+24]
    cld
    rep movsb                          # the thread block outlives this stack: copy it to the heap
    lea rdi, [rbx+200]
    xor esi, esi
    mov rdx, qword ptr [rbx+176]
    mov rcx, r12
    call qword ptr [rbx+8]             # pthread_create(&t, NULL, thread_main, block)
    mov qword ptr [rbx+40], rax
    test eax, eax
    jnz 2f
    mov rdi, qword ptr [rbx+200]
    call qword ptr [rbx+16]            # pthread_detach(t)
    jmp 1f
2:
    mov rdi, r12
    call qword ptr [rbx+192]           # free(block): no thread took it
1:
    mov eax, -1
    mov edx, -1
    xrstor64 [rbx+256]
    mov qword ptr [rbx+32], 2          # state: done; what follows only restores the thread
    mov eax, 39
    syscall                            # getpid: the tracer's stop here reads the result (harmless alone)
    mov r11, rbx
    push qword ptr [r11+168]
    popfq
    mov rax, qword ptr [r11+48]
    mov rdx, qword ptr [r11+64]
    mov rsi, qword ptr [r11+72]
    mov rdi, qword ptr [r11+80]
    mov rbp, qword ptr [r11+88]
    mov r8,  qword ptr [r11+96]
    mov r9,  qword ptr [r11+104]
    mov r10, qword ptr [r11+112]
    mov r12, qword ptr [r11+120]
    mov r13, qword ptr [r11+128]
    mov r14, qword ptr [r11+136]
    mov r15, qword ptr [r11+144]
    mov rcx, qword ptr [r11+160]       # rcx and r11 hold what the syscall instruction leaves in them
    mov rbx, qword ptr [r11+56]
    mov rsp, qword ptr [r11+152]
    mov r11, qword ptr [r11+168]
    jmp rcx
    .p2align 4
thread_main:                           # rdi: the thread block on the heap
    push rbx
    push r12
    sub rsp, 8
    mov rbx, rdi
    call qword ptr [rbx+0]             # PyGILState_Ensure()
    mov r12d, eax
    lea rdi, [rbx+32]
    xor esi, esi
    call qword ptr [rbx+8]             # PyRun_SimpleStringFlags(code, NULL)
    mov edi, r12d
    call qword ptr [rbx+16]            # PyGILState_Release(state)
    mov rdi, rbx
    call qword ptr [rbx+24]            # free(block)
    add rsp, 8
    pop r12
    pop rbx
    xor eax, eax
    ret
"""
TRAMPOLINE = bytes.fromhex(
    "48c7432001000000b8ffffffffbaffffffff480faea30001000048c74328ffffffff488b7b18ff134885c074474989c44889"
    "c7488bb3b8000000488b4b18fcf3a4488dbbc800000031f6488b93b00000004c89e1ff53084889432885c0750c488bbbc800"
    "0000ff5310eb094c89e7ff93c0000000b8ffffffffbaffffffff480faeab0001000048c7432002000000b8270000000f0549"
    "89db41ffb3a80000009d498b4330498b5340498b7348498b7b50498b6b584d8b43604d8b4b684d8b53704d8b63784d8bab80"
    "0000004d8bb3880000004d8bbb90000000498b8ba0000000498b5b38498ba3980000004d8b9ba8000000ffe166662e0f1f84"
    "0000000000905341544883ec084889fbff134189c4488d7b2031f6ff53084489e7ff53104889dfff53184883c408415c5b31"
    "c0c3"
)
THREAD_MAIN = 0x100  # thread_main's offset in TRAMPOLINE (after .p2align 4)

# The control block, 64-byte aligned on the borrowed thread's stack (offsets used by TRAMPOLINE).
CB_MALLOC, CB_PTHREAD_CREATE, CB_PTHREAD_DETACH, CB_BLOCK_SIZE, CB_STATE, CB_RESULT = 0, 8, 16, 24, 32, 40
CB_SAVED = 48  # rax rbx rdx rsi rdi rbp r8 r9 r10 r12 r13 r14 r15 rsp rip rflags, 8 bytes each
CB_SAVED_ORDER = ("rax", "rbx", "rdx", "rsi", "rdi", "rbp", "r8", "r9", "r10", "r12", "r13", "r14", "r15", "rsp", "rip", "eflags")
CB_THREAD_MAIN, CB_BLOCK, CB_FREE = 176, 184, 192  # (200: the pthread_t)
CB_XSAVE = 256  # the xsave area: 64-byte aligned, its 64-byte header zeroed (xrstor refuses a dirty one)
XSAVE_HEADER_END = 512 + 64  # the header follows the 512-byte legacy region
# The thread block, copied to the heap for the new thread: the Python API, free, then the code.
TB_CODE = 32
STATE_NOT_STARTED, STATE_STARTED, STATE_DONE = 0, 1, 2
NR_GETPID = 39
SYSCALL_INSN = b"\x0f\x05"
MARKER_END = TRAMPOLINE.index(bytes.fromhex("b827000000") + SYSCALL_INSN) + 7  # rip at the getpid's stop

RED_ZONE = 128  # the System V ABI lets leaf code keep data in the 128 bytes below rsp
STACK_NEEDED = 64 * 1024  # below the control block, for malloc and pthread_create
PAGE = 4096

# ----------------------------------------------------------------------------------- the safe points

SLEEP, IO_WAIT, READ, FUTEX = 0, 1, 2, 3  # preference order: a sleeping thread is the safest to borrow
# Only syscalls that the kernel resumes by itself after the ptrace stop (-ERESTART*, or a restart block for the
# time left): the job sees no EINTR that it would not see without gputop.  Left out on purpose, since they
# return EINTR to the job after any ptrace interrupt: epoll_wait/epoll_pwait/epoll_pwait2 (always), and socket
# reads (recv*, accept*, read on a socket), which do whenever the socket has a receive timeout.
SAFE_SYSCALLS: dict[int, tuple[str, int]] = {
    35: ("nanosleep", SLEEP),
    230: ("clock_nanosleep", SLEEP),
    7: ("poll", IO_WAIT),
    271: ("ppoll", IO_WAIT),
    23: ("select", IO_WAIT),
    270: ("pselect6", IO_WAIT),
    0: ("read", READ),
    19: ("readv", READ),
    202: ("futex", FUTEX),
}
FUTEX_CMD_MASK = 0x7F  # without FUTEX_PRIVATE_FLAG and FUTEX_CLOCK_REALTIME
FUTEX_WAITS = (0, 9)  # FUTEX_WAIT, FUTEX_WAIT_BITSET
# libraries whose data hold the locks the call itself takes (malloc's arenas, stdio, dlopen's loader lock)
LOCK_OWNING_LIBRARY = re.compile(r"/(libc[.-][^/]*|libpthread[.-][^/]*|ld-linux[^/]*|ld-[0-9.]+\.so[^/]*|ld-musl[^/]*)$")
# ... and the interpreter's image, whose data hold the GIL: a thread waiting for the GIL sits in the GIL's
# condition variable, and a thread dropping the GIL may have to wait, holding the GIL's mutex, until every
# waiter of the old group has woken (glibc's condition variables).  Borrowing such a waiter stalls the whole
# interpreter for the call; when the call itself took the GIL (an earlier design) the job froze for good.
PYTHON_IMAGE = re.compile(r"/libpython3[^/]*$")
# Code whose callers may hold a lock the call takes: the dynamic loader (dlopen's constructors run under its
# load lock, which pthread_create's TLS setup takes), fork (its at-fork handlers and the allocator's fork locks)
# and a replacement allocator (pthread_create allocates through it).
LOADER = re.compile(r"/(ld-linux[^/]*|ld-[0-9.]+\.so[^/]*|ld-musl[^/]*)$")
ALLOCATOR = re.compile(r"/lib(jemalloc|tcmalloc[^/]*|mimalloc|tbbmalloc|hoard)[^/]*\.so[^/]*$")
FORK_FUNCTIONS = ("fork", "__libc_fork", "_Fork", "vfork", "__fork")
STACK_SCAN_BYTES = 64 * 1024
READABLE_FD = re.compile(r"^pipe:\[|^anon_inode:\[?eventfd")  # a pipe or eventfd read restarts; a socket's may not

ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK = 512, 513, 514, 516
NR_RESTART_SYSCALL = 219

FIND_BOUND_S = 3.0  # how long to look for a safe thread
RETRY_S = 0.005  # between rounds that found none
CALL_BOUND_S = 5.0  # how long the call may run before the tracer lets go (the thread still restores itself)
SWITCHED_TIMEOUT = (
    "thread {tid} of PID {pid} was running the injected call when gputop let go; it finishes the call and goes "
    "back to the job by itself, and the agent may still start: do not inject again until it has answered"
)

# ----------------------------------------------------------------------------------------- ptrace

PTRACE_POKEDATA = 5
PTRACE_CONT, PTRACE_SYSCALL, PTRACE_DETACH = 7, 24, 17
PTRACE_O_TRACESYSGOOD = 1
PTRACE_GETREGS, PTRACE_SETREGS = 12, 13
PTRACE_GETREGSET = 0x4204
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_LISTEN = 0x4206, 0x4207, 0x4208
PTRACE_EVENT_STOP = 128
NT_X86_XSTATE = 0x202
WALL = 0x40000000  # __WALL: wait for a thread that is not our child
SYS_TGKILL = 234

REG_NAMES = (
    "r15",
    "r14",
    "r13",
    "r12",
    "rbp",
    "rbx",
    "r11",
    "r10",
    "r9",
    "r8",
    "rax",
    "rcx",
    "rdx",
    "rsi",
    "rdi",
    "orig_rax",
    "rip",
    "cs",
    "eflags",
    "rsp",
    "ss",
    "fs_base",
    "gs_base",
    "ds",
    "es",
    "fs",
    "gs",
)


class Refused(Exception):
    """No safe point, or something the injection cannot work with: the one-line reason a user reads."""


class TargetGone(Exception):
    pass


class _Regs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in REG_NAMES]

    def copy(self) -> "_Regs":
        other = _Regs()
        ctypes.memmove(ctypes.byref(other), ctypes.byref(self), ctypes.sizeof(self))
        return other


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, tid: int, addr: int = 0, data: int | ctypes.c_void_p = 0) -> int:
    ctypes.set_errno(0)
    pointer = data if isinstance(data, ctypes.c_void_p) else ctypes.c_void_p(data)
    result: int = _libc.ptrace(request, tid, ctypes.c_void_p(addr), pointer)  # (restype c_long: an int)
    if result == -1:
        err = ctypes.get_errno()
        if err:
            raise OSError(err, os.strerror(err))
    return result


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# ------------------------------------------------------------------------------------ the process


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    path: str


def read_maps(pid: int) -> list[Mapping]:
    maps = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            start, end = (int(x, 16) for x in parts[0].split("-"))
            maps.append(Mapping(start, end, parts[1], int(parts[2], 16), parts[5].strip() if len(parts) > 5 else ""))
    return maps


def mapping_at(maps: list[Mapping], address: int) -> Optional[Mapping]:
    for m in maps:
        if m.start <= address < m.end:
            return m
    return None


def owning_file(maps: list[Mapping], address: int) -> str:
    """The file whose image holds `address`: a library's .bss is the nameless mapping right after its
    file-backed data, and libc's locks live there."""
    for i, m in enumerate(maps):
        if m.start <= address < m.end:
            while not m.path and i > 0 and maps[i - 1].end == m.start and maps[i - 1].path.startswith("/"):
                i -= 1
                m = maps[i]
            return m.path
    return ""


def _executable(pid: int) -> str:
    """The target's executable as its maps name it (a statically linked python holds the GIL there)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


@dataclass(frozen=True)
class ThreadSyscall:
    """/proc/PID/task/TID/syscall of a blocked thread: the number and its six arguments."""

    tid: int
    nr: int
    args: tuple[int, ...]


def blocked_threads(pid: int) -> list[ThreadSyscall]:
    found: list[ThreadSyscall] = []
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                words = f.read().split()
        except OSError:
            continue
        if len(words) >= 7 and words[0].lstrip("-").isdigit() and int(words[0]) >= 0:
            found.append(ThreadSyscall(tid, int(words[0]), tuple(int(w, 16) for w in words[1:7])))
    return found


def unsafe_reason(
    pid: int, nr: int, args: tuple[int, ...], maps: list[Mapping], lock_owners: frozenset[str] = frozenset()
) -> Optional[str]:
    """Why a thread blocked in syscall `nr` with `args` is no safe point; None when it is one.  `lock_owners`:
    more libraries whose futex words are locks the call takes (a replacement allocator's)."""
    known = SAFE_SYSCALLS.get(nr)
    if known is None:
        return f"in syscall {nr}"
    name, kind = known
    if kind == FUTEX:
        if args[1] & FUTEX_CMD_MASK not in FUTEX_WAITS:
            return f"futex operation {args[1] & FUTEX_CMD_MASK}"
        owner = owning_file(maps, args[0])
        if LOCK_OWNING_LIBRARY.search(owner) or PYTHON_IMAGE.search(owner) or owner == _executable(pid) or owner in lock_owners:
            return f"waiting on a lock of {os.path.basename(owner)}"
    elif kind == READ:
        try:
            what = os.readlink(f"/proc/{pid}/fd/{args[0]}")
        except OSError:
            return f"{name} on an unreadable descriptor"
        if not READABLE_FD.search(what):
            return f"{name} on {what}"
    return None


PYTHON_FUNCTIONS = ("PyGILState_Ensure", "PyRun_SimpleStringFlags", "PyGILState_Release")
LIBC_FUNCTIONS = ("malloc", "free", "pthread_create", "pthread_detach")


@dataclass(frozen=True)
class TargetApi:
    """Addresses in the target: the functions the trampoline calls, and where the trampoline goes."""

    functions: dict[str, int]  # name -> address
    cave: int
    # (start, end, why) of code a borrowed thread must not be inside, sorted: see `stack_danger`
    danger: tuple[tuple[int, int, str], ...] = ()
    lock_owners: frozenset[str] = frozenset()  # more libraries whose data hold locks the call takes (an allocator)

    def __getitem__(self, name: str) -> int:
        return self.functions[name]


def _elf_objects(pid: int, maps: list[Mapping]) -> list[tuple[str, int, int]]:
    """(path as the target sees it, where its first page is mapped, rank) of each mapped ELF file the
    trampoline may use: libpython, the executable, then libc and libpthread (old glibc's pthread_create)."""
    first_mapping: dict[str, Mapping] = {}
    for m in maps:
        if m.path.startswith("/") and not m.path.endswith(" (deleted)") and m.offset == 0 and m.path not in first_mapping:
            first_mapping[m.path] = m
    exe = _executable(pid)

    def rank(path: str) -> int:
        name = os.path.basename(path)
        if PYTHON_IMAGE.search(path):
            return 0
        if path == exe:
            return 1
        if re.match(r"(libc[.-]|libc\.musl|ld-musl)", name):
            return 2
        if name.startswith("libpthread"):
            return 3
        return 9

    found = [(p, m.start, rank(p)) for p, m in first_mapping.items() if rank(p) < 9]
    return sorted(found, key=lambda item: item[2])


_api_cache: dict[tuple[int, int], TargetApi] = {}  # (pid, its start time) -> what find_api read


def find_api(pid: int, maps: list[Mapping]) -> TargetApi:
    """Look the trampoline's functions up in the target's own ELF files (its root: a container's libc is
    not ours) and find the spare tail of an executable page to hold it.  A process's code does not move,
    so a caller that injects again into the same process (the tests' stress runs) reads them once."""
    from gputop.collect.procfs import read_stat

    stat = read_stat(pid)
    key = (pid, stat.start_ticks if stat is not None else -1)
    if key not in _api_cache:
        _api_cache[key] = _read_api(pid, maps)
    return _api_cache[key]


def _read_api(pid: int, maps: list[Mapping]) -> TargetApi:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.hash import ELFHashSection, GNUHashSection

    functions: dict[str, int] = {}
    caves: list[int] = []
    fork_code: set[tuple[int, int, str]] = set()
    for path, first_start, rank in _elf_objects(pid, maps):
        wanted = PYTHON_FUNCTIONS if rank <= 1 else LIBC_FUNCTIONS
        try:
            with open(f"/proc/{pid}/root{path}", "rb") as f:
                elf = ELFFile(f)
                if elf["e_machine"] != "EM_X86_64":
                    raise Refused(f"the target is not an x86-64 process ({elf['e_machine']})")
                loads = [seg for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"]
                if not loads:
                    continue
                bias = first_start - (min(seg["p_vaddr"] for seg in loads) & ~(PAGE - 1))
                caves.extend(_caves(loads, bias, maps))
                table = elf.get_section_by_name(".gnu.hash") or elf.get_section_by_name(".hash")
                if table is not None and not isinstance(table, (GNUHashSection, ELFHashSection)):
                    raise AttributeError(f"{path}: its hash section is not a hash table")  # (skipped below, as before)
                for name in wanted:
                    symbol = table.get_symbol(name) if table is not None and name not in functions else None
                    if symbol is not None and symbol["st_shndx"] != "SHN_UNDEF" and symbol["st_value"]:
                        functions[name] = bias + symbol["st_value"]
                if rank == 2 and table is not None:
                    for name in FORK_FUNCTIONS:
                        symbol = table.get_symbol(name)
                        if symbol is not None and symbol["st_shndx"] != "SHN_UNDEF" and symbol["st_value"] and symbol["st_size"]:
                            start = bias + symbol["st_value"]
                            fork_code.add((start, start + symbol["st_size"], "inside fork (its at-fork handlers hold locks)"))
        except (ELFError, ValueError, OSError, KeyError, AttributeError):
            continue
    missing = [n for n in PYTHON_FUNCTIONS + LIBC_FUNCTIONS if n not in functions]
    if missing:
        where = "its executable or libpython" if set(missing) & set(PYTHON_FUNCTIONS) else "its C library"
        raise Refused(f"the target's {', '.join(missing)} were not found in {where}")
    if not caves:
        raise Refused("no spare bytes at the end of an executable page of the target's Python or libc")
    allocators = _allocators(pid, maps)
    danger = fork_code | {
        (m.start, m.end, f"inside {why}")
        for m in maps
        if "x" in m.perms
        for why in (
            ["the dynamic loader (dlopen, a symbol lookup)"] * bool(LOADER.search(m.path))
            + [f"the allocator {os.path.basename(m.path)}"] * (m.path in allocators)
        )
    }
    return TargetApi(functions, caves[0], tuple(sorted(danger)), frozenset(allocators))


def _allocators(pid: int, maps: list[Mapping]) -> set[str]:
    """Mapped libraries that replace malloc (jemalloc, tcmalloc, mimalloc, ...: by name, or any LD_PRELOADed
    library that defines malloc).  pthread_create allocates through them, so their locks are the call's too."""
    from gputop.collect.procfs import read_environ

    preloaded = set(((read_environ(pid) or {}).get("LD_PRELOAD") or "").replace(":", " ").split())
    found = set()
    for path in {m.path for m in maps if m.path.startswith("/")}:
        if ALLOCATOR.search(path):
            found.add(path)
        elif path in preloaded or os.path.basename(path) in preloaded:
            if _defines(pid, path, "malloc"):
                found.add(path)
    return found


def _defines(pid: int, path: str, name: str) -> bool:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(f"/proc/{pid}/root{path}", "rb") as f:
            table = ELFFile(f).get_section_by_name(".dynsym")
            symbols = table.get_symbol_by_name(name) if table is not None else None  # type: ignore[attr-defined]
            return any(sym["st_shndx"] != "SHN_UNDEF" for sym in symbols or ())
    except (ELFError, OSError, ValueError, AttributeError):
        return False


def stack_danger(memory: _Memory, rip: int, rsp: int, stack: Mapping, danger: tuple[tuple[int, int, str], ...]) -> Optional[str]:
    """Why the thread may hold a lock the call needs, read from its own stack; None when nothing says so.

    Every return address of the thread's live frames lies between its stack pointer and the top of its stack:
    a word there that points into fork's code, the dynamic loader or a replacement allocator means the thread
    is inside one of them (a stale word in an unwritten slot can only make this refuse more, never less).  The
    first STACK_SCAN_BYTES hold the frames between the blocking call and such a caller."""
    if not danger:
        return None
    starts = [d[0] for d in danger]

    def inside(address: int) -> Optional[str]:
        i = bisect.bisect_right(starts, address) - 1
        return danger[i][2] if i >= 0 and address < danger[i][1] else None

    why = inside(rip)
    if why is not None:
        return why
    end = min(stack.end, rsp + STACK_SCAN_BYTES)
    try:
        data = memory.read(rsp, max(0, end - rsp))
    except OSError:
        return "its stack could not be read"
    for (word,) in struct.iter_unpack("<Q", data[: len(data) // 8 * 8]):
        why = inside(word)
        if why is not None and _follows_call(memory, word):
            return why
    return None


def _follows_call(memory: _Memory, address: int) -> bool:
    """Whether `address` is where a call returns: right after a call instruction.  A function pointer kept on
    the stack (ld.so's _dl_fini, handed to __libc_start_main) follows padding, not a call."""
    try:
        b = memory.read(address - 7, 7)
    except OSError:
        return False
    return (
        b[2] == 0xE8  # call rel32
        or (b[1] == 0xFF and (b[2] >> 3) & 7 == 2)  # call [rip+disp32] / [reg+disp32]
        or (b[4] == 0xFF and (b[5] >> 3) & 7 == 2)  # call [reg+disp8], a REX-prefixed call reg
        or (b[5] == 0xFF and (b[6] >> 3) & 7 == 2)  # call reg / [reg]
    )


def _caves(loads: list[Segment], bias: int, maps: list[Mapping]) -> list[int]:
    """The unused tail of each executable segment's last page: mapped executable, never jumped to."""
    found: list[int] = []
    for seg in loads:
        if not seg["p_flags"] & 1:  # PF_X
            continue
        start = (bias + seg["p_vaddr"] + seg["p_memsz"] + 15) & ~15
        page_end = (start + PAGE - 1) & ~(PAGE - 1)
        holder = mapping_at(maps, start)
        if page_end - start >= len(TRAMPOLINE) and holder and "x" in holder.perms and holder.end >= page_end:
            found.append(start)
    return found


# ---------------------------------------------------------------------------------------- memory


class _Memory:
    """The target's memory through /proc/PID/mem (data) and PTRACE_POKEDATA (the read-only code page)."""

    def __init__(self, pid: int):
        self.fd = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)

    def close(self) -> None:
        os.close(self.fd)

    def read(self, address: int, size: int) -> bytes:
        return os.pread(self.fd, size, address)

    def write(self, address: int, data: bytes) -> None:
        done = os.pwrite(self.fd, data, address)
        if done != len(data):
            raise OSError(errno.EIO, f"short write at {address:#x}")

    def write_code(self, tid: int, address: int, data: bytes) -> None:
        if self.read(address, len(data)) == data:
            return  # an earlier injection left the same trampoline here
        start, end = address & ~7, (address + len(data) + 7) & ~7
        image = bytearray(self.read(start, end - start))
        image[address - start : address - start + len(data)] = data
        for at in range(start, end, 8):
            _ptrace(PTRACE_POKEDATA, tid, at, int.from_bytes(image[at - start : at - start + 8], "little"))
        if self.read(address, len(data)) != data:
            raise Refused("the trampoline could not be written into the target")


# ---------------------------------------------------------------------------------------- waiting


def _wait_stop(tid: int, deadline: float) -> Optional[int]:
    """The status of `tid`'s next stop, or None past `deadline`."""
    pause = 0.0002
    while True:
        got, status = os.waitpid(tid, os.WNOHANG | WALL)
        if got:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.002)


def _stop_now(tid: int, deadline: float) -> None:
    """Interrupt a seized, running thread and wait for the interrupt stop.  A signal met on the way is delivered
    there and then, as it would have been without us (its handler, or its default action, runs now); gputop
    never holds a signal back, so none can be lost with the helper, and none arrives twice."""
    _ptrace(PTRACE_INTERRUPT, tid)
    while True:
        status = _wait_stop(tid, deadline)
        if status is None:
            raise TimeoutError
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            raise TargetGone
        if (status >> 16) == PTRACE_EVENT_STOP:
            return
        _ptrace(PTRACE_CONT, tid, 0, os.WSTOPSIG(status))  # a signal-delivery stop: deliver it now
        _ptrace(PTRACE_INTERRUPT, tid)


def stopped_refusal(pid: int) -> Optional[str]:
    """The one line for a stopped process (a Ctrl-Z, a Slurm suspend, a debugger): nothing may be injected into
    it, and its frozen stack says nothing about its loader.  None while it runs."""
    from gputop.collect.procfs import stopped_by

    by = stopped_by(pid)
    if by is None:
        return None
    resume = f"; `kill -CONT {pid}` resumes it" if by == "SIGSTOP" else ""
    return f"PID {pid} is stopped ({by}); nothing was injected{resume}"


# ------------------------------------------------------------------------------------------ inject


@dataclass
class Outcome:
    ran: bool
    tid: int = 0
    syscall: str = ""
    result: Optional[int] = None  # pthread_create's answer: 0 (the code's thread started), -1 (no memory), errno
    attempts: int = 0
    seconds: float = 0.0
    reason: str = ""
    skipped: Counter[str] = field(default_factory=Counter)  # why each thread seen was no safe point


def resume_registers(regs: _Regs) -> _Regs:
    """Where the parked thread goes on: as the kernel would resume it after a signal with no handler."""
    out = regs.copy()
    error = _signed(regs.rax)
    if _signed(regs.orig_rax) >= 0:
        if error in (-ERESTARTSYS, -ERESTARTNOINTR, -ERESTARTNOHAND):
            out.rax = regs.orig_rax
            out.rip = regs.rip - 2
        elif error == -ERESTART_RESTARTBLOCK:
            out.rax = NR_RESTART_SYSCALL
            out.rip = regs.rip - 2
    out.orig_rax = (1 << 64) - 1  # the kernel must not apply its own restart on top
    return out


def _xstate_size(tid: int) -> int:
    buf = ctypes.create_string_buffer(64 * 1024)
    iov = _IoVec(ctypes.cast(buf, ctypes.c_void_p), len(buf))
    try:
        _ptrace(PTRACE_GETREGSET, tid, NT_X86_XSTATE, ctypes.c_void_p(ctypes.addressof(iov)))
    except OSError:
        raise Refused("this CPU or kernel offers no XSAVE state to preserve") from None
    length: int = iov.len  # (a c_size_t field)
    return (length + 63) & ~63


def inject(
    pid: int,
    code: str,
    find_bound: float = FIND_BOUND_S,
    call_bound: float = CALL_BOUND_S,
    _pause_at: Optional[str] = None,
    on_switch: Optional[Callable[[int], None]] = None,
) -> Outcome:
    """Run `code` in `pid` on a thread parked at a safe point.  Raises Refused with one line.  `on_switch(tid)`
    is called once a thread's registers point at the trampoline: from then on it runs the call whatever happens."""
    started = time.monotonic()
    if os.uname().machine != "x86_64":
        raise Refused(f"safe-point injection is built for x86-64; this machine is {os.uname().machine}")
    refusal = stopped_refusal(pid)
    if refusal is not None:
        raise Refused(refusal)
    payload = code.encode() + b"\0"
    try:
        maps = read_maps(pid)
    except OSError as exc:
        raise Refused(f"cannot read /proc/{pid}/maps: {exc.strerror}") from None
    api = find_api(pid, maps)
    outcome = Outcome(ran=False)
    find_deadline = started + find_bound
    while True:
        candidates = []
        for t in blocked_threads(pid):
            why = unsafe_reason(pid, t.nr, t.args, maps, api.lock_owners)
            if why is None:
                candidates.append((SAFE_SYSCALLS[t.nr][1], t.tid == pid, t.tid))
            else:
                outcome.skipped[why] += 1
        for _kind, _main, tid in sorted(candidates):
            outcome.attempts += 1
            done = _try_thread(pid, tid, api, payload, maps, outcome, call_bound, _pause_at, on_switch)
            if done:
                outcome.seconds = time.monotonic() - started
                return outcome
        if time.monotonic() >= find_deadline:
            break
        time.sleep(RETRY_S)
        try:
            maps = read_maps(pid)  # libraries come and go (a new futex word may sit in a new mapping)
        except OSError:
            raise Refused(f"PID {pid} is gone") from None
    seen = "; ".join(f"{why} ({n}x)" for why, n in outcome.skipped.most_common(3)) or "every thread was running"
    raise Refused(f"no thread of PID {pid} reached a safe point within {find_bound:g}s ({seen}); nothing was injected")


def _pause(where: str, pause_at: Optional[str]) -> None:
    """Test hook: announce `where` on stdout and wait to be killed there."""
    if pause_at == where:
        print(json.dumps({"paused": where}), flush=True)
        time.sleep(3600)


def _try_thread(
    pid: int,
    tid: int,
    api: TargetApi,
    payload: bytes,
    maps: list[Mapping],
    outcome: Outcome,
    call_bound: float,
    pause_at: Optional[str],
    on_switch: Optional[Callable[[int], None]],
) -> bool:
    """One attach: stop `tid`, check it is parked safely, run the call.  False (thread untouched) when it
    is not a safe point after all."""
    try:
        _ptrace(PTRACE_SEIZE, tid, 0, PTRACE_O_TRACESYSGOOD)
    except OSError as exc:
        if exc.errno == errno.EPERM:
            if _traced_by_other(tid):
                outcome.skipped["traced by another debugger"] += 1
                return False
            raise Refused(f"not permitted to trace PID {pid} (ptrace: {exc.strerror})") from None
        return False  # the thread ended
    switched = False
    try:
        _stop_now(tid, time.monotonic() + 1.0)
        regs = _getregs(tid)
        nr = _signed(regs.orig_rax)
        memory = _Memory(pid)
        try:
            why = (
                "not stopped in a syscall"
                if nr < 0
                else unsafe_reason(pid, nr, (regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9), maps, api.lock_owners)
            )
            if why is None and memory.read(regs.rip - 2, 2) != SYSCALL_INSN:
                why = "not at a syscall instruction"
            stack = mapping_at(maps, regs.rsp)
            xsize = _xstate_size(tid)
            frame = CB_XSAVE + xsize + TB_CODE + len(payload)
            block = (regs.rsp - RED_ZONE - frame) & ~63
            if why is None and (stack is None or block - STACK_NEEDED < stack.start and "[stack]" not in stack.path):
                why = "too little stack left"
            if why is None and stack is not None:
                why = stack_danger(memory, regs.rip, regs.rsp, stack, api.danger)
            if why is not None:
                outcome.skipped[why] += 1
                return False
            _pause("stopped", pause_at)
            resume = resume_registers(regs)
            thread_block = (
                struct.pack(
                    "<QQQQ", api["PyGILState_Ensure"], api["PyRun_SimpleStringFlags"], api["PyGILState_Release"], api["free"]
                )
                + payload
            )
            control = bytearray(CB_XSAVE + XSAVE_HEADER_END)  # zeroes the xsave header too
            struct.pack_into(
                "<QQQQQQ",
                control,
                CB_MALLOC,
                api["malloc"],
                api["pthread_create"],
                api["pthread_detach"],
                len(thread_block),
                STATE_NOT_STARTED,
                0,
            )
            struct.pack_into(
                "<" + "Q" * len(CB_SAVED_ORDER), control, CB_SAVED, *(getattr(resume, name) for name in CB_SAVED_ORDER)
            )
            struct.pack_into("<QQQ", control, CB_THREAD_MAIN, api.cave + THREAD_MAIN, block + CB_XSAVE + xsize, api["free"])
            memory.write_code(tid, api.cave, TRAMPOLINE)
            memory.write(block, bytes(control))
            memory.write(block + CB_XSAVE + xsize, thread_block)
            call = regs.copy()
            call.rip = api.cave
            call.rbx = block
            call.rsp = (block - 64) & ~15
            call.rax = 0
            call.orig_rax = (1 << 64) - 1
            _setregs(tid, call)
            switched = True
            if on_switch is not None:
                on_switch(tid)
            _pause("switched", pause_at)
            # From here the thread runs the call and restores itself, with or without us.
            outcome.tid = tid
            outcome.syscall = SAFE_SYSCALLS[nr][0]
            _run_call(tid, memory, api, block, resume, time.monotonic() + call_bound, outcome, pause_at)
            return True
        finally:
            memory.close()
    except TargetGone:
        raise Refused(f"PID {pid} exited during the injection") from None
    except TimeoutError:
        if switched:
            raise Refused(SWITCHED_TIMEOUT.format(tid=tid, pid=pid)) from None
        raise Refused(f"thread {tid} of PID {pid} did not stop when asked; nothing was injected") from None
    finally:
        _detach_stopped(tid)


def _run_call(
    tid: int,
    memory: _Memory,
    api: TargetApi,
    block: int,
    resume: _Regs,
    deadline: float,
    outcome: Outcome,
    pause_at: Optional[str],
) -> None:
    """Let the thread run the trampoline, stopping at each of its syscalls (PTRACE_SYSCALL) until the
    marker syscall, where the control block is still intact below the thread's stack.  Past `deadline`:
    undo the switch if the call has not started, else let the thread finish it alone."""
    marker = api.cave + MARKER_END
    _ptrace(PTRACE_SYSCALL, tid, 0, 0)
    interrupted = False
    while True:
        status = _wait_stop(tid, deadline if not interrupted else time.monotonic() + 1.0)
        if status is None:
            if interrupted:
                raise TimeoutError
            _ptrace(PTRACE_INTERRUPT, tid)  # past the deadline: stop it where it is
            interrupted = True
            continue
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            raise TargetGone
        sig, event = os.WSTOPSIG(status), status >> 16
        if sig == signal.SIGTRAP | 0x80:  # a syscall stop (PTRACE_O_TRACESYSGOOD)
            regs = _getregs(tid)
            if regs.rip == marker and regs.orig_rax == NR_GETPID:
                outcome.result = struct.unpack("<q", memory.read(block + CB_RESULT, 8))[0]
                outcome.ran = outcome.result == 0
                if not outcome.ran:
                    outcome.reason = "the target could not start a thread: " + (
                        "out of memory" if outcome.result == -1 else os.strerror(outcome.result)
                    )
                return  # detached by the caller at this stop: the getpid runs, the trampoline restores
            if state_of(memory, block) == STATE_STARTED:
                _pause("calling", pause_at)
        elif event == PTRACE_EVENT_STOP:
            if sig in (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
                _ptrace(PTRACE_LISTEN, tid, 0, 0)  # the job was stopped (Ctrl-Z): stay stopped with it
                continue
            if interrupted:
                break
        else:
            _ptrace(PTRACE_SYSCALL, tid, 0, sig)  # the job's own signal, delivered as usual
            continue
        _ptrace(PTRACE_SYSCALL, tid, 0, 0)
    # stopped at the deadline
    if state_of(memory, block) == STATE_NOT_STARTED:
        _setregs(tid, resume)  # nothing ran: the thread goes back to its syscall as if never touched
        outcome.reason = "the thread did not start the call before the deadline; it was put back untouched"
    else:
        outcome.ran = True
        outcome.reason = (
            "the injected call was still running at the deadline; gputop let the thread go and it "
            "returns to the job by itself when the call ends"
        )


def state_of(memory: _Memory, block: int) -> int:
    state: int = struct.unpack("<Q", memory.read(block + CB_STATE, 8))[0]
    return state


def _getregs(tid: int) -> _Regs:
    regs = _Regs()
    _ptrace(PTRACE_GETREGS, tid, 0, ctypes.c_void_p(ctypes.addressof(regs)))
    return regs


def _setregs(tid: int, regs: _Regs) -> None:
    _ptrace(PTRACE_SETREGS, tid, 0, ctypes.c_void_p(ctypes.addressof(regs)))


def _detach_stopped(tid: int) -> None:
    """Let the thread go (it holds no signal of the job's: each was delivered when it came)."""
    try:
        _ptrace(PTRACE_DETACH, tid, 0, 0)
    except OSError:
        return  # not stopped (it ran off after a failed interrupt) or gone: the kernel detaches at our exit


def _traced_by_other(tid: int) -> bool:
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1]) not in (0, os.getpid())
    except OSError:
        pass
    return False


# ------------------------------------------------------------------------------------------ helper


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gputop.inject.safepoint", description="Run one line of Python in a live process at a safe point."
    )
    parser.add_argument("pid", type=int)
    parser.add_argument("--code", required=True)
    parser.add_argument("--find-seconds", type=float, default=FIND_BOUND_S)
    parser.add_argument("--call-seconds", type=float, default=CALL_BOUND_S)
    args = parser.parse_args(argv)
    pause_at = os.environ.get("GPUTOP_SAFEPOINT_PAUSE_AT")  # tests: stop here and wait to be killed
    # Deaf to the terminal: a Ctrl-Z or Ctrl-C meant for gputop must not stop or end this helper while it
    # holds a thread of the job (gputop also starts it in a session of its own).  Only its deadline ends it.
    for sig in (signal.SIGINT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)

    def switched(tid: int) -> None:  # said at once, so a gputop that kills us past its deadline knows the state
        print(json.dumps({"switched": tid}), flush=True)

    _pause("starting", pause_at)
    print(json.dumps({"started": True}), flush=True)  # gputop's deadline for the rest counts from here
    try:
        out = inject(args.pid, args.code, args.find_seconds, args.call_seconds, pause_at, on_switch=switched)
        answer = {
            "ran": out.ran,
            "tid": out.tid,
            "syscall": out.syscall,
            "result": out.result,
            "attempts": out.attempts,
            "seconds": round(out.seconds, 4),
            "reason": out.reason,
        }
    except Refused as exc:
        answer = {"ran": False, "refused": str(exc)}
    except OSError as exc:
        answer = {"ran": False, "refused": f"injection into PID {args.pid} failed: {exc.strerror or exc}"}
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
