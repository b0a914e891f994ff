/* Places a thread can sit where it holds a lock that an injected call needs, for tests/test_do_no_harm.py.
 *
 *   cc -shared -fPIC -o lock_holders.so lock_holders.c -lpthread
 *
 * park_in_fork_for(ms): a pthread_atfork prepare handler that parks the forking thread inside glibc's fork(),
 *     in a timed wait on this library's own condition variable (a futex word outside libc: the syscall rule
 *     alone would call it a safe point); with $LOCK_HOLDERS_RELEASE set, until that file exists (park_for).
 * Built with -DPARK_IN_CONSTRUCTOR_MS=N: a constructor that parks the thread inside dlopen() (under ld.so's
 *     load lock, which pthread_create's TLS setup takes) for N ms, or until $LOCK_HOLDERS_RELEASE exists.
 * count_signal(sig) / signals_received(): a C handler that counts every delivery of `sig` (Python's own
 *     handler coalesces signals that arrive before it runs, so it cannot count queued real-time signals).
 * Built with -DREPLACE_MALLOC: malloc/free/calloc/realloc that forward to glibc's, as jemalloc or tcmalloc
 *     would stand in for them under LD_PRELOAD.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t park_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t park_cond = PTHREAD_COND_INITIALIZER;

static void add_ms(struct timespec *t, long ms) {
    t->tv_sec += ms / 1000;
    t->tv_nsec += (ms % 1000) * 1000000L;
    if (t->tv_nsec >= 1000000000L) {
        t->tv_sec += 1;
        t->tv_nsec -= 1000000000L;
    }
}

/* Parks for `ms`, or until the file named by $LOCK_HOLDERS_RELEASE exists (looked for every 20 ms): a test
 * releases the thread once it has seen what it waited for, instead of waiting out a park long enough for a
 * loaded box. */
static void park_for(long ms) {
    const char *release = getenv("LOCK_HOLDERS_RELEASE");
    struct timespec until, slice;
    clock_gettime(CLOCK_REALTIME, &until);
    add_ms(&until, ms);
    pthread_mutex_lock(&park_mutex);
    for (;;) {
        clock_gettime(CLOCK_REALTIME, &slice);
        add_ms(&slice, 20);
        if (slice.tv_sec > until.tv_sec || (slice.tv_sec == until.tv_sec && slice.tv_nsec > until.tv_nsec)) {
            slice = until;
        }
        int waited = pthread_cond_timedwait(&park_cond, &park_mutex, &slice);
        if (waited == ETIMEDOUT && (slice.tv_sec == until.tv_sec && slice.tv_nsec == until.tv_nsec)) {
            break;
        }
        if (waited == ETIMEDOUT && release != NULL && access(release, F_OK) == 0) {
            break;
        }
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
