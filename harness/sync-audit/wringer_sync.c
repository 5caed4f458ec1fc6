/*
 * The sync observer: preloaded into audited programs, it reports who waited for whom.
 *
 * Every pthread operation that orders one thread after another (a mutex, rwlock or spinlock
 * released and taken, a condition signalled and waited for, a semaphore posted and taken, a
 * barrier passed, a thread's end and its join) is told to the syscall recorder as a marker
 * syscall on the calling thread:
 *
 *     prctl(WRINGER_SYNC, kind, object, call site, 0)    -> EINVAL, no effect
 *
 * prctl is cheap, already recorded by both recorders (eBPF and strace), and carries five
 * arguments. A marker therefore lands in the one trace, in the thread's own order among its
 * descriptor calls: no second file, no clocks to merge. The checker turns markers into
 * happens-before edges (orchestration/happens_before.rs).
 *
 * To keep the trace small, a lock's acquire is only reported when another thread released it
 * last, and its release only once a second thread has taken it: a lock one thread keeps to
 * itself orders nothing and costs no marker.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define WRINGER_SYNC 0x57534e43L /* "WSNC" */

enum {
    SYNC_ATTACH = 1,  /* the observer is loaded in this process (object: its pid) */
    SYNC_ACQUIRE = 2, /* the thread is now ordered after the object's releases */
    SYNC_RELEASE = 3, /* what the thread did so far is ordered before later acquires */
    SYNC_WAIT = 4,    /* the thread starts a blocking wait on the object (join, cond, sem) */
    SYNC_HOLD = 5,    /* the thread took a lock (for lock order; object: the lock) */
    SYNC_DROP = 6,    /* the thread let a lock go */
    SYNC_END = 7,     /* the thread ends (object: its pthread_t): a release its join acquires */
    SYNC_START = 8,   /* the thread starts (object: its pthread_t): whom a join of it waits for */
    SYNC_SITE_SLOT = 9, /* where this thread keeps its descriptor call's site (object: the slot) */
    SYNC_OWN = 12,      /* the process synchronizes through its own futexes (once per process) */
};

/* What a SYNC_WAIT waits for (its aux), plus WAIT_TIMED when the wait has a deadline. */
enum { WAIT_JOIN = 1, WAIT_COND = 2, WAIT_SEM = 3, WAIT_BARRIER = 4, WAIT_LOCK = 5, WAIT_TIMED = 16 };

/* `aux`: for an acquire whose release was not reported (the lock was not shared yet), the
 * thread that released it last; the checker then orders after that thread's events so far. */
/* libc's syscall(), which this library also wraps (below): its own markers go straight to it. */
static long (*real_syscall)(long, ...);

static long raw_syscall(long nr, long a, long b, long c, long d, long e, long f)
{
    if (!real_syscall)
        real_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return real_syscall(nr, a, b, c, d, e, f);
}

static void mark_aux(long kind, const void *object, const void *site, long aux)
{
    /* The marker fails with EINVAL by design: the program's errno must not see it (a reader
     * of errno after readdir, say, would take it for its own error). */
    int saved = errno;
    raw_syscall(SYS_prctl, WRINGER_SYNC, kind, (long)(uintptr_t)object, (long)(uintptr_t)site,
                aux, 0);
    errno = saved;
}

static void mark(long kind, const void *object, const void *site)
{
    mark_aux(kind, object, site, 0);
}

/* Locks by address: who released each last, and whether a second thread ever took it. A
 * fixed open-addressed table; when it is full, every operation is reported (correct, only
 * larger). */
#define SLOTS 65536
struct slot {
    _Atomic(uintptr_t) key;
    _Atomic(long) last_releaser;
    _Atomic(int) last_tried; /* the last releaser had taken it by a try */
    _Atomic(int) shared;
};
static struct slot slots[SLOTS];

static struct slot *slot_of(const void *object)
{
    uintptr_t key = (uintptr_t)object;
    if (key == 0)
        return NULL;
    size_t h = (size_t)((key >> 3) * 0x9e3779b97f4a7c15ULL) & (SLOTS - 1);
    for (size_t i = 0; i < 64; i++) {
        struct slot *s = &slots[(h + i) & (SLOTS - 1)];
        uintptr_t seen = atomic_load_explicit(&s->key, memory_order_acquire);
        if (seen == key)
            return s;
        if (seen == 0) {
            uintptr_t empty = 0;
            if (atomic_compare_exchange_strong(&s->key, &empty, key) || empty == key)
                return s;
        }
    }
    return NULL;
}

static long self_tid(void)
{
    static __thread long tid;
    if (!tid)
        tid = syscall(SYS_gettid);
    return tid;
}

/* The locks this thread holds, and whether each one's HOLD was told. A HOLD is told lazily,
 * when it matters to the wait-for audit: the thread takes a lock under another for the first
 * time under that one (a new lock-order edge), or waits while holding it. Then every lock held
 * is told first, so the checker knows the thread's held set at that point. Who else takes a
 * lock the checker learns from the acquires: a thread that spins on a lock under another
 * (V8's workers do) costs two markers once, not two per turn (under strace each is a stop). */
#define HELD_MAX 32
struct held {
    const void *lock;
    const void *site;
    int told;
    int tried;
};

/* In a HOLD's or ACQUIRE's aux: this thread took the lock by a try (it never blocks on it, so
 * it can neither be stalled by its holder nor close a lock-order cycle); in an ACQUIRE's aux,
 * the releaser it names had taken it by a try. */
#define SELF_TRY (1L << 62)
#define PREV_TRY (1L << 61)
static __thread struct held held[HELD_MAX];
static __thread int held_n;

/* Lock-order edges this thread already told (outer, inner), a small ring. */
#define EDGES 64
static __thread const void *edge_outer[EDGES], *edge_inner[EDGES];
static __thread int edge_next;

static int edge_told(const void *outer, const void *inner)
{
    for (int i = 0; i < EDGES; i++)
        if (edge_outer[i] == outer && edge_inner[i] == inner)
            return 1;
    edge_outer[edge_next] = outer;
    edge_inner[edge_next] = inner;
    edge_next = (edge_next + 1) % EDGES;
    return 0;
}

static void tell_held(void)
{
    for (int i = 0; i < held_n; i++)
        if (!held[i].told) {
            mark_aux(SYNC_HOLD, held[i].lock, held[i].site, held[i].tried ? SELF_TRY : 0);
            held[i].told = 1;
        }
}

/* A lock was taken by this thread. */
static void took(const void *lock, const void *site, int tried)
{
    struct slot *s = slot_of(lock);
    long me = self_tid();
    int shared = 1;
    if (!s) {
        mark_aux(SYNC_ACQUIRE, lock, site, tried ? SELF_TRY : 0);
    } else {
        long last = atomic_load_explicit(&s->last_releaser, memory_order_relaxed);
        if (last != 0 && last != me) {
            int was = atomic_exchange_explicit(&s->shared, 1, memory_order_relaxed);
            long prev = atomic_load_explicit(&s->last_tried, memory_order_relaxed) ? PREV_TRY : 0;
            mark_aux(SYNC_ACQUIRE, lock, site, (was ? 0 : (last | prev)) | (tried ? SELF_TRY : 0));
        }
        shared = atomic_load_explicit(&s->shared, memory_order_relaxed);
    }
    /* A new edge under the innermost lock held: tell the held set, then this lock. */
    int nested = held_n > 0 && !edge_told(held[held_n - 1].lock, lock);
    if (nested)
        tell_held();
    int added = held_n < HELD_MAX;
    if (added) {
        held[held_n].lock = lock;
        held[held_n].site = site;
        held[held_n].told = 0;
        held[held_n].tried = tried;
        held_n++;
    }
    (void)shared;
    if (nested || !added) {
        mark_aux(SYNC_HOLD, lock, site, tried ? SELF_TRY : 0);
        if (added)
            held[held_n - 1].told = 1;
    }
}

/* A lock is about to be let go by this thread. */
static void letting_go(const void *lock, const void *site)
{
    struct slot *s = slot_of(lock);
    int tried = 0;
    for (int i = held_n - 1; i >= 0; i--) {
        if (held[i].lock != lock)
            continue;
        tried = held[i].tried;
        if (held[i].told)
            mark(SYNC_DROP, lock, site);
        held[i] = held[held_n - 1];
        held_n--;
        break;
    }
    if (!s || atomic_load_explicit(&s->shared, memory_order_relaxed))
        mark(SYNC_RELEASE, lock, site);
    if (s) {
        atomic_store_explicit(&s->last_tried, tried, memory_order_relaxed);
        atomic_store_explicit(&s->last_releaser, self_tid(), memory_order_relaxed);
    }
}

/* A blocking wait starts: what the thread holds is told first. */
static void waiting(const void *object, const void *site, long kind)
{
    tell_held();
    mark_aux(SYNC_WAIT, object, site, kind);
}

#define REAL(ret, name, ...)                                                                   \
    static ret (*real_##name)(__VA_ARGS__);                                                    \
    static ret (*get_##name(void))(__VA_ARGS__)                                                \
    {                                                                                          \
        if (!real_##name)                                                                      \
            real_##name = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name);                        \
        return real_##name;                                                                    \
    }

REAL(int, pthread_mutex_lock, pthread_mutex_t *)
REAL(int, pthread_mutex_trylock, pthread_mutex_t *)
REAL(int, pthread_mutex_timedlock, pthread_mutex_t *, const struct timespec *)
REAL(int, pthread_mutex_unlock, pthread_mutex_t *)
REAL(int, pthread_rwlock_rdlock, pthread_rwlock_t *)
REAL(int, pthread_rwlock_wrlock, pthread_rwlock_t *)
REAL(int, pthread_rwlock_tryrdlock, pthread_rwlock_t *)
REAL(int, pthread_rwlock_trywrlock, pthread_rwlock_t *)
REAL(int, pthread_rwlock_unlock, pthread_rwlock_t *)
REAL(int, pthread_spin_lock, pthread_spinlock_t *)
REAL(int, pthread_spin_trylock, pthread_spinlock_t *)
REAL(int, pthread_spin_unlock, pthread_spinlock_t *)
REAL(int, pthread_cond_wait, pthread_cond_t *, pthread_mutex_t *)
REAL(int, pthread_cond_timedwait, pthread_cond_t *, pthread_mutex_t *, const struct timespec *)
REAL(int, pthread_cond_signal, pthread_cond_t *)
REAL(int, pthread_cond_broadcast, pthread_cond_t *)
REAL(int, sem_post, sem_t *)
REAL(int, sem_wait, sem_t *)
REAL(int, sem_trywait, sem_t *)
REAL(int, sem_timedwait, sem_t *, const struct timespec *)
REAL(int, pthread_barrier_wait, pthread_barrier_t *)
REAL(int, pthread_create, pthread_t *, const pthread_attr_t *, void *(*)(void *), void *)
REAL(int, pthread_join, pthread_t, void **)
REAL(int, pthread_timedjoin_np, pthread_t, void **, const struct timespec *)
REAL(int, pthread_tryjoin_np, pthread_t, void **)
REAL(void, pthread_exit, void *)

/* The process's module map, appended to `$WRINGER_SYNC_MAPS.<pid>.maps` (a prefix in the run's
 * private folder) when the observer attaches and when the program exits: the checker turns
 * call sites into file:line from it after the process is gone (the second copy has what
 * dlopen added). Nothing is written when the variable is unset. */
static void save_maps(void)
{
    const char *prefix = getenv("WRINGER_SYNC_MAPS");
    if (!prefix || !*prefix)
        return;
    int saved = errno;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s.%d.maps", prefix, (int)getpid());
    int in = -1, out = -1;
    if (n > 0 && (size_t)n < sizeof path)
        in = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (in >= 0)
        out = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (out >= 0) {
        static const char head[] = "wringer-sync maps\n"; /* a snapshot starts: its first file is the program */
        if (write(out, head, sizeof head - 1) < 0)
            goto done;
        char buf[8192];
        ssize_t r;
        while ((r = read(in, buf, sizeof buf)) > 0)
            if (write(out, buf, (size_t)r) != r)
                break;
    }
done:
    if (out >= 0)
        close(out);
    if (in >= 0)
        close(in);
    errno = saved;
}

/* Descriptor calls' call sites. A finding about a descriptor names the calls on it (a read
 * not ordered before a close); where they were made is what a person fixes. Each descriptor
 * call below notes, while it runs, where it was called from and its first argument, in a
 * thread-local slot whose address the thread tells the recorder once (SYNC_SITE_SLOT). The
 * eBPF recorder reads the slot at the syscall's entry and keeps the site when the syscall's
 * first argument is the call's (so a signal handler's raw syscall meanwhile gets none): no
 * syscall per call, one marker per thread. strace cannot read it, and gives no sites. */
struct call_site {
    uint64_t site;
    uint64_t first;
};
static __thread struct call_site here __attribute__((tls_model("initial-exec")));
static __thread int here_told __attribute__((tls_model("initial-exec")));

/* A forked child's thread has a new id: it tells its slot again, and its handle (the child's
 * main thread, which no pthread_create started). */
static atomic_int own_sync_told;

static void forget_slot(void)
{
    here_told = 0;
    atomic_store(&own_sync_told, 0);
    mark(SYNC_START, (void *)pthread_self(), NULL);
}

static inline struct call_site calling(uint64_t first, const void *site)
{
    struct call_site prev = here;
    if (!here_told) {
        here_told = 1;
        mark(SYNC_SITE_SLOT, &here, NULL);
    }
    here.first = first;
    here.site = (uint64_t)(uintptr_t)site;
    return prev;
}

__attribute__((constructor)) static void attach(void)
{
    mark(SYNC_ATTACH, (void *)(uintptr_t)getpid(), NULL);
    /* The main thread's handle, so that a join of it names whom it waits for. */
    mark(SYNC_START, (void *)pthread_self(), NULL);
    pthread_atfork(NULL, NULL, forget_slot);
    save_maps();
}

__attribute__((destructor)) static void detach(void)
{
    save_maps();
}

#define SITE __builtin_return_address(0)

/* A try-lock call: the real one, and on success what it means for the order (a try never
 * blocks: it is told as one). */
#define TRYING(name, type, lock)                                                          \
    int name(type *lock)                                                                       \
    {                                                                                          \
        int r = get_##name()(lock);                                                            \
        if (r == 0)                                                                            \
            took((const void *)(uintptr_t)lock, SITE, 1);                                      \
        return r;                                                                              \
    }

/* A blocking lock call: tried first, and only when the lock is busy is the wait told (with
 * the locks this thread holds), so that a hang's wait-for cycle can be named from the trace.
 * An uncontended lock costs no marker. The try answers as the lock would for a lock this
 * thread holds (a recursive one is taken again, an error-checking one gives EBUSY and then
 * the lock's own EDEADLK). */
#define BLOCKING(name, try, type, lock)                                                        \
    int name(type *lock)                                                                       \
    {                                                                                          \
        int r = get_##try()(lock);                                                             \
        if (r == EBUSY) {                                                                      \
            waiting((const void *)(uintptr_t)lock, SITE, WAIT_LOCK);                           \
            r = get_##name()(lock);                                                            \
        }                                                                                      \
        if (r == 0)                                                                            \
            took((const void *)(uintptr_t)lock, SITE, 0);                                      \
        return r;                                                                              \
    }

BLOCKING(pthread_mutex_lock, pthread_mutex_trylock, pthread_mutex_t, m)
TRYING(pthread_mutex_trylock, pthread_mutex_t, m)
BLOCKING(pthread_rwlock_rdlock, pthread_rwlock_tryrdlock, pthread_rwlock_t, l)
BLOCKING(pthread_rwlock_wrlock, pthread_rwlock_trywrlock, pthread_rwlock_t, l)
TRYING(pthread_rwlock_tryrdlock, pthread_rwlock_t, l)
TRYING(pthread_rwlock_trywrlock, pthread_rwlock_t, l)
BLOCKING(pthread_spin_lock, pthread_spin_trylock, pthread_spinlock_t, l)
TRYING(pthread_spin_trylock, pthread_spinlock_t, l)

int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *t)
{
    int r = get_pthread_mutex_timedlock()(m, t);
    if (r == 0)
        took(m, SITE, 0);
    return r;
}

#define UNLOCKING(name, type)                                                                  \
    int name(type *lock)                                                                       \
    {                                                                                          \
        letting_go((const void *)(uintptr_t)lock, SITE);                                       \
        return get_##name()(lock);                                                             \
    }

UNLOCKING(pthread_mutex_unlock, pthread_mutex_t)
UNLOCKING(pthread_rwlock_unlock, pthread_rwlock_t)
UNLOCKING(pthread_spin_unlock, pthread_spinlock_t)

/* A condition wait lets its mutex go, waits, and takes it again. The signal it waited for is
 * an edge from the signaller; so is the mutex, from whoever held it meanwhile. */
int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
{
    letting_go(m, SITE);
    waiting(c, SITE, WAIT_COND);
    int r = get_pthread_cond_wait()(c, m);
    mark(SYNC_ACQUIRE, c, SITE);
    took(m, SITE, 0);
    return r;
}

int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *t)
{
    letting_go(m, SITE);
    waiting(c, SITE, WAIT_COND | WAIT_TIMED);
    int r = get_pthread_cond_timedwait()(c, m, t);
    mark(SYNC_ACQUIRE, c, SITE);
    took(m, SITE, 0);
    return r;
}

int pthread_cond_signal(pthread_cond_t *c)
{
    mark(SYNC_RELEASE, c, SITE);
    return get_pthread_cond_signal()(c);
}

int pthread_cond_broadcast(pthread_cond_t *c)
{
    mark(SYNC_RELEASE, c, SITE);
    return get_pthread_cond_broadcast()(c);
}

int sem_post(sem_t *s)
{
    mark(SYNC_RELEASE, s, SITE);
    return get_sem_post()(s);
}

int sem_wait(sem_t *s)
{
    waiting(s, SITE, WAIT_SEM);
    int r = get_sem_wait()(s);
    if (r == 0)
        mark(SYNC_ACQUIRE, s, SITE);
    return r;
}

int sem_trywait(sem_t *s)
{
    int r = get_sem_trywait()(s);
    if (r == 0)
        mark(SYNC_ACQUIRE, s, SITE);
    return r;
}

int sem_timedwait(sem_t *s, const struct timespec *t)
{
    waiting(s, SITE, WAIT_SEM | WAIT_TIMED);
    int r = get_sem_timedwait()(s, t);
    if (r == 0)
        mark(SYNC_ACQUIRE, s, SITE);
    return r;
}

int pthread_barrier_wait(pthread_barrier_t *b)
{
    mark(SYNC_RELEASE, b, SITE);
    waiting(b, SITE, WAIT_BARRIER);
    int r = get_pthread_barrier_wait()(b);
    mark(SYNC_ACQUIRE, b, SITE);
    return r;
}

/* A thread's end is a release on its handle, which its join acquires. */
struct start {
    void *(*routine)(void *);
    void *arg;
};

static void *trampoline(void *p)
{
    struct start s = *(struct start *)p;
    free(p);
    mark(SYNC_START, (void *)pthread_self(), (void *)s.routine);
    void *r = s.routine(s.arg);
    mark(SYNC_END, (void *)pthread_self(), (void *)s.routine);
    return r;
}

int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*routine)(void *), void *arg)
{
    struct start *s = malloc(sizeof *s);
    if (!s)
        return get_pthread_create()(t, a, routine, arg);
    s->routine = routine;
    s->arg = arg;
    int r = get_pthread_create()(t, a, trampoline, s);
    if (r != 0)
        free(s);
    return r;
}

void pthread_exit(void *r)
{
    mark(SYNC_END, (void *)pthread_self(), SITE);
    get_pthread_exit()(r);
    __builtin_unreachable();
}

int pthread_join(pthread_t t, void **r)
{
    waiting((void *)t, SITE, WAIT_JOIN);
    int e = get_pthread_join()(t, r);
    if (e == 0)
        mark(SYNC_ACQUIRE, (void *)t, SITE);
    return e;
}

int pthread_timedjoin_np(pthread_t t, void **r, const struct timespec *ts)
{
    waiting((void *)t, SITE, WAIT_JOIN | WAIT_TIMED);
    int e = get_pthread_timedjoin_np()(t, r, ts);
    if (e == 0)
        mark(SYNC_ACQUIRE, (void *)t, SITE);
    return e;
}

int pthread_tryjoin_np(pthread_t t, void **r)
{
    int e = get_pthread_tryjoin_np()(t, r);
    if (e == 0)
        mark(SYNC_ACQUIRE, (void *)t, SITE);
    return e;
}

/* A descriptor call as the program made it, with its site noted while it runs (the previous
 * one put back after: a signal handler's call nests). `first` is the first argument as the
 * syscall receives it. */
#define UNPAREN(...) __VA_ARGS__
#define AROUND(ret, name, params, args, first)                                                 \
    REAL(ret, name, UNPAREN params)                                                            \
    ret name(UNPAREN params)                                                                   \
    {                                                                                          \
        struct call_site prev = calling((uint64_t)(first), SITE);                              \
        ret r = get_##name()(UNPAREN args);                                                    \
        here = prev;                                                                           \
        return r;                                                                              \
    }

AROUND(ssize_t, read, (int fd, void *b, size_t n), (fd, b, n), fd)
AROUND(ssize_t, write, (int fd, const void *b, size_t n), (fd, b, n), fd)
AROUND(ssize_t, readv, (int fd, const struct iovec *v, int n), (fd, v, n), fd)
AROUND(ssize_t, writev, (int fd, const struct iovec *v, int n), (fd, v, n), fd)
AROUND(ssize_t, pread, (int fd, void *b, size_t n, off_t o), (fd, b, n, o), fd)
AROUND(ssize_t, pwrite, (int fd, const void *b, size_t n, off_t o), (fd, b, n, o), fd)
AROUND(ssize_t, pread64, (int fd, void *b, size_t n, off64_t o), (fd, b, n, o), fd)
AROUND(ssize_t, pwrite64, (int fd, const void *b, size_t n, off64_t o), (fd, b, n, o), fd)
AROUND(ssize_t, recv, (int fd, void *b, size_t n, int f), (fd, b, n, f), fd)
AROUND(ssize_t, recvfrom,
       (int fd, void *b, size_t n, int f, struct sockaddr *a, socklen_t *l),
       (fd, b, n, f, a, l), fd)
AROUND(ssize_t, recvmsg, (int fd, struct msghdr *m, int f), (fd, m, f), fd)
AROUND(int, recvmmsg, (int fd, struct mmsghdr *m, unsigned int n, int f, struct timespec *t),
       (fd, m, n, f, t), fd)
AROUND(ssize_t, send, (int fd, const void *b, size_t n, int f), (fd, b, n, f), fd)
AROUND(ssize_t, sendto,
       (int fd, const void *b, size_t n, int f, const struct sockaddr *a, socklen_t l),
       (fd, b, n, f, a, l), fd)
AROUND(ssize_t, sendmsg, (int fd, const struct msghdr *m, int f), (fd, m, f), fd)
AROUND(int, sendmmsg, (int fd, struct mmsghdr *m, unsigned int n, int f), (fd, m, n, f), fd)
AROUND(int, poll, (struct pollfd *p, nfds_t n, int t), (p, n, t), (uintptr_t)p)
AROUND(int, ppoll, (struct pollfd *p, nfds_t n, const struct timespec *t, const sigset_t *s),
       (p, n, t, s), (uintptr_t)p)
AROUND(int, epoll_wait, (int fd, struct epoll_event *e, int n, int t), (fd, e, n, t), fd)
AROUND(int, epoll_pwait, (int fd, struct epoll_event *e, int n, int t, const sigset_t *s),
       (fd, e, n, t, s), fd)
AROUND(int, epoll_ctl, (int fd, int op, int on, struct epoll_event *e), (fd, op, on, e), fd)
AROUND(int, accept, (int fd, struct sockaddr *a, socklen_t *l), (fd, a, l), fd)
AROUND(int, accept4, (int fd, struct sockaddr *a, socklen_t *l, int f), (fd, a, l, f), fd)
AROUND(int, connect, (int fd, const struct sockaddr *a, socklen_t l), (fd, a, l), fd)
AROUND(int, shutdown, (int fd, int how), (fd, how), fd)
AROUND(int, close, (int fd), (fd), fd)
AROUND(int, dup2, (int from, int to), (from, to), from)
AROUND(int, dup3, (int from, int to, int f), (from, to, f), from)
AROUND(int, close_range, (unsigned int first, unsigned int last, int f), (first, last, f), first)

/* Code that synchronizes through futexes of its own (Rust's std locks, channels and thread
 * parking; C++20's atomic waits) calls libc's syscall() for them: glibc's own locks never do.
 * Such code can hand a descriptor over with no marker or syscall at all (a lock-free queue), so
 * the order of its calls cannot be judged from what shows: the process says so once, and the
 * checker then judges its releases only by what is certain. */
long syscall(long nr, ...)
{
    va_list ap;
    va_start(ap, nr);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
    long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    if (nr == SYS_futex && !atomic_exchange(&own_sync_told, 1))
        mark(SYNC_OWN, NULL, SITE);
    return raw_syscall(nr, a, b, c, d, e, f);
}
