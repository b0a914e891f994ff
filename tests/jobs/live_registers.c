/* A thread that keeps values in twelve SSE registers (xmm4-xmm15: asm takes 30 operands) and MXCSR across a blocking syscall, and checks
   them after every one: the kernel preserves them, so the compiler may too, and so must anything that
   borrows the thread while it is parked (tests/test_safepoint.py).

   park_and_check(fd, rounds): `rounds` times, nanosleep 2 ms through a raw syscall (a relative sleep:
   the kernel restarts it with restart_syscall after an interruption) with xmm4-xmm15 and MXCSR set;
   after each, the round count goes to `fd` (pwrite at 0); a changed register writes "CORRUPT" there and
   returns -1. */
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <xmmintrin.h>

#define LIVE(n) register double r##n __asm__("xmm" #n) = 1.25 + n

long park_and_check(int fd, long rounds) {
    unsigned int mxcsr = (_mm_getcsr() & ~0x6000u) | 0x2000u; /* round down: not the default */
    _mm_setcsr(mxcsr);
    for (long i = 1; i <= rounds; i++) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        long ret;
        LIVE(4); LIVE(5); LIVE(6); LIVE(7); LIVE(8); LIVE(9); LIVE(10); LIVE(11); LIVE(12); LIVE(13); LIVE(14);
        LIVE(15);
        __asm__ volatile("syscall"
                         : "=a"(ret), "+x"(r4), "+x"(r5), "+x"(r6), "+x"(r7), "+x"(r8), "+x"(r9), "+x"(r10),
                           "+x"(r11), "+x"(r12), "+x"(r13), "+x"(r14), "+x"(r15)
                         : "0"(35L), "D"(&ts), "S"(0L)
                         : "rcx", "r11", "memory");
        double seen[16] = {0, 0, 0, 0, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15};
        for (int n = 4; n < 16; n++) {
            if (seen[n] != 1.25 + n || _mm_getcsr() != mxcsr) {
                char text[64];
                int len = snprintf(text, sizeof text, "CORRUPT xmm%d", n);
                pwrite(fd, text, len, 0);
                return -1;
            }
        }
        char text[32];
        int len = snprintf(text, sizeof text, "%ld          ", i);
        pwrite(fd, text, len, 0);
    }
    return 0;
}
