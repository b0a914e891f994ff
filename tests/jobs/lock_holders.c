/* Places a thread can sit where it holds a lock that an injected call needs, for tests/test_do_no_harm.py.
 *
 *   cc -shared -fPIC -o lock_holders.so lock_holders.c -lpthread
 *
 * park_in_fork_for(ms): a pthread_atfork prepare handler that parks the forking thread inside glibc's fork(),
 *     in a timed wait on this library's own condition variable (a futex word outside libc: the syscall rule
 *     alone would call it a safe point).
 * Built with -DPARK_IN_CONSTRUCTOR_MS=N: a constructor that parks the thread inside dlopen() (under ld.so's
 *     load lock, which pthread_create's TLS setup takes) for N ms.
 * count_signal(sig) / signals_received(): a C handler that counts every delivery of `sig` (Python's own
 *     handler coalesces signals that arrive before it runs, so it cannot count queued real-time signals).
 * Built with -DREPLACE_MALLOC: malloc/free/calloc/realloc that forward to glibc's, as jemalloc or tcmalloc
 *     would stand in for them under LD_PRELOAD.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t park_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t park_cond = PTHREAD_COND_INITIALIZER;

static void park_for(long ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&park_mutex);
    while (pthread_cond_timedwait(&park_cond, &park_mutex, &until) == 0) {
    }
    pthread_mutex_unlock(&park_mutex);
}

static long fork_park_ms;
static void park_in_prepare(void) { park_for(fork_park_ms); }

int park_in_fork_for(long ms) {
    fork_park_ms = ms;
    return pthread_atfork(park_in_prepare, NULL, NULL);
}

#ifdef PARK_IN_CONSTRUCTOR_MS
__attribute__((constructor)) static void park_in_constructor(void) { park_for(PARK_IN_CONSTRUCTOR_MS); }
#endif

static atomic_long received;
static void on_signal(int sig) {
    (void)sig;
    atomic_fetch_add(&received, 1);
}

int count_signal(int sig) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

long signals_received(void) { return atomic_load(&received); }

#ifdef REPLACE_MALLOC
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }
void *calloc(size_t n, size_t size) { return __libc_calloc(n, size); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
#endif
