# Python without verbs: threads allocating and freeing large bytearrays (each its own
# mapping), the mmap module (anonymous and file-backed, resize = mremap, madvise), os.fork
# with waitpid, multiprocessing (fork, spawn, forkserver), subprocess, posix_spawn, and
# ctypes calling libc's mmap/madvise/munmap directly. Everything printed depends only on
# the work; exits 7 so a changed exit status is seen too.
import ctypes
import ctypes.util
import hashlib
import mmap
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading

PAGE = mmap.PAGESIZE


def out(*a):
    print(*a, flush=True)


# Threads: large bytearrays (malloc'd with mmap, freed with munmap), checked and hashed.
def worker(i, results):
    h = hashlib.sha256()
    for r in range(30):
        b = bytearray((1 << 20) + i * 4096 + r)  # > 1 MiB each: its own mapping
        b[0] = i
        b[-1] = r
        b[len(b) // 2] = (i * r) & 0xFF
        h.update(bytes(b[:16]) + bytes(b[-16:]) + bytes([b[len(b) // 2]]))
        b.extend(b"x" * 100000)  # grows: realloc of an mmapped chunk (mremap)
        h.update(bytes(b[-4:]))
        del b
    results[i] = h.hexdigest()[:16]


def square_sum(n):
    b = bytearray(2 << 20)
    b[n] = n & 0xFF
    return n * n + b[n]


def main():
    results = {}
    threads = [threading.Thread(target=worker, args=(i, results)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in sorted(results):
        out("thread", i, results[i])

    # mmap module: anonymous maps, madvise(DONTNEED) (a private map reads back zeros, a
    # shared one keeps its data), a file map resized (mremap), close (munmap).
    for flags in (mmap.MAP_PRIVATE, mmap.MAP_SHARED):
        m = mmap.mmap(-1, 64 * PAGE, flags=flags)
        m.write(b"\x5a" * (64 * PAGE))
        m.madvise(mmap.MADV_DONTNEED, 8 * PAGE, 8 * PAGE)
        out("mmap dontneed", m[8 * PAGE], m[16 * PAGE], m[0])
        m.close()
    with tempfile.TemporaryFile() as f:
        f.write(b"abc" * PAGE)
        f.flush()
        fm = mmap.mmap(f.fileno(), 3 * PAGE)
        fm.resize(6 * PAGE)  # grows the file and the mapping (mremap)
        fm[-3:] = b"xyz"
        out("mmap file", bytes(fm[:6]), bytes(fm[-6:]), len(fm))
        fm.close()

    # os.fork + waitpid: the child allocates, maps, unmaps, exits with a code.
    codes = []
    for k in range(5):
        pid = os.fork()
        if pid == 0:
            big = bytearray(8 << 20)
            big[-1] = k
            mm = mmap.mmap(-1, 16 * PAGE)
            mm[0] = k
            mm.close()
            os._exit(10 + big[-1])
        _, st = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(st))
    out("fork codes", codes)

    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        out("pool", sum(pool.map(square_sum, range(40))))
    for method in ("spawn", "forkserver"):  # fresh interpreters, started by fork+exec
        with multiprocessing.get_context(method).Pool(2) as pool:
            out(method, sum(pool.map(square_sum, range(8))))
    p = ctx.Process(target=os._exit, args=(3,))
    p.start()
    p.join()
    out("process exitcode", p.exitcode)

    r = subprocess.run(["sh", "-c", "echo sub $((6*7)); exit 4"], capture_output=True, text=True)
    out("subprocess", r.stdout.strip(), r.returncode)
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 6"], os.environ)  # vfork/clone
    out("posix_spawn", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))

    # ctypes: libc's own mmap/madvise/munmap, called directly.
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    n = 32 * PAGE
    addr = libc.mmap(None, n, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    buf = (ctypes.c_ubyte * n).from_address(addr)
    ctypes.memset(addr, 0x77, n)
    rc1 = libc.madvise(addr + 4 * PAGE, 4 * PAGE, mmap.MADV_DONTNEED)
    seen = (buf[0], buf[4 * PAGE], buf[8 * PAGE])
    rc2 = libc.munmap(addr + 16 * PAGE, 16 * PAGE)
    rc3 = libc.munmap(addr, 16 * PAGE)
    # Errors keep their errno: an unaligned munmap is EINVAL.
    rc4 = libc.munmap(addr + 1, PAGE)
    err = ctypes.get_errno()
    out("ctypes", rc1, seen, rc2, rc3, rc4, err == 22)
    sys.exit(7)


if __name__ == "__main__":
    main()
