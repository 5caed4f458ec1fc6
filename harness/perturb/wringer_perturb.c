/*
 * The perturbation observer: preloaded into a rank and every program it starts, it delays
 * chosen calls through libc's wrappers, on entry or on exit, with no tracer attached. Nothing
 * stops: a thread that makes a chosen call sleeps in it; every other thread runs on.
 *
 * Rules come from WRINGER_PERTURB, one per `;`:
 *
 *     SYSCALL,ENTER_US,EXIT_US,FIRST,LAST,STEP
 *
 * Calls are counted per thread and per rule, as strace's `--inject ... when=` counts them: a
 * call is delayed when its number n (from 1) has n >= FIRST (0: every call), n <= LAST (0: no
 * last) and (n - FIRST) % STEP == 0 (0: only FIRST, or every call from FIRST when LAST is
 * set). A rule names the syscall; the wrappers that make it count (libc's recv makes recvfrom,
 * as strace sees it).
 *
 * Which calls were delayed is evidence: at exit each process that delayed any writes how many
 * per rule, and the first ones (thread, call number), to WRINGER_PERTURB_LOG.<pid>.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_RULES 8
#define NAME_LEN 24
#define KEPT 64

struct rule {
    char syscall[NAME_LEN];
    long enter_us, exit_us;
    unsigned long first, last, step;
    _Atomic(unsigned long) delayed;
    _Atomic(unsigned long) kept;
    struct { long tid; unsigned long call; } first_delays[KEPT];
};

static struct rule rules[MAX_RULES];
static int n_rules;
static __thread unsigned long counts[MAX_RULES];

static void parse_rules(void)
{
    const char *spec = getenv("WRINGER_PERTURB");
    if (spec == NULL)
        return;
    char buf[1024];
    strncpy(buf, spec, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    char *save = NULL;
    for (char *r = strtok_r(buf, ";", &save); r != NULL && n_rules < MAX_RULES;
         r = strtok_r(NULL, ";", &save)) {
        struct rule *x = &rules[n_rules];
        char name[NAME_LEN];
        if (sscanf(r, "%23[a-z0-9_],%ld,%ld,%lu,%lu,%lu", name, &x->enter_us, &x->exit_us,
                   &x->first, &x->last, &x->step) == 6) {
            strcpy(x->syscall, name);
            n_rules++;
        }
    }
}

static void sleep_us(long us)
{
    struct timespec t = { .tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000 };
    /* Through the syscall, not libc's nanosleep: a delay is no call of the program's. */
    while (syscall(SYS_nanosleep, &t, &t) == -1 && errno == EINTR)
        ;
}

static int chosen(const struct rule *x, unsigned long n)
{
    if (x->first == 0)
        return 1;
    if (n < x->first || (x->last != 0 && n > x->last))
        return 0;
    if (x->step == 0)
        return x->last != 0 || n == x->first;
    return (n - x->first) % x->step == 0;
}

/* Count this call of `syscall` against every rule that names it; the delays it gets. */
static void decide(const char *name, long *enter, long *exit)
{
    *enter = 0;
    *exit = 0;
    for (int i = 0; i < n_rules; i++) {
        struct rule *x = &rules[i];
        if (strcmp(x->syscall, name) != 0)
            continue;
        unsigned long n = ++counts[i];
        if (!chosen(x, n))
            continue;
        *enter += x->enter_us;
        *exit += x->exit_us;
        atomic_fetch_add(&x->delayed, 1);
        unsigned long k = atomic_fetch_add(&x->kept, 1);
        if (k < KEPT) {
            x->first_delays[k].tid = syscall(SYS_gettid);
            x->first_delays[k].call = n;
        }
    }
}

static void write_log(void)
{
    const char *prefix = getenv("WRINGER_PERTURB_LOG");
    if (prefix == NULL || n_rules == 0)
        return;
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", prefix, (int)getpid());
    int fd = syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    char line[512];
    for (int i = 0; i < n_rules; i++) {
        struct rule *x = &rules[i];
        unsigned long d = atomic_load(&x->delayed);
        if (d == 0)
            continue;
        int len = snprintf(line, sizeof line, "%s: %lu call(s) delayed (thread:call of the first:",
                           x->syscall, d);
        unsigned long kept = d < KEPT ? d : KEPT;
        for (unsigned long k = 0; k < kept && len < 400; k++)
            len += snprintf(line + len, sizeof line - len, " %ld:%lu", x->first_delays[k].tid,
                            x->first_delays[k].call);
        line[len++] = ')';
        line[len++] = '\n';
        syscall(SYS_write, fd, line, len);
    }
    syscall(SYS_close, fd);
}

/* Every libc function wrapped here, and where its real definition is: found at load, so that
 * no wrapper calls dlsym later (in a signal handler, say). */
#define WRAPPED(X)                                                                       \
    X(poll) X(ppoll) X(accept) X(accept4) X(connect) X(recv) X(recvfrom) X(recvmsg)      \
    X(send) X(sendto) X(sendmsg) X(read) X(write) X(readv) X(writev) X(close)            \
    X(shutdown) X(epoll_wait) X(epoll_pwait)
#define DECLARE(name) static __typeof__(name) *real_##name;
#define RESOLVE(name) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name);
WRAPPED(DECLARE)

__attribute__((constructor)) static void start(void)
{
    WRAPPED(RESOLVE)
    parse_rules();
}

__attribute__((destructor)) static void end(void)
{
    write_log();
}

/* The next definition of `name` (libc's); a call made before the constructor ran (another
 * library's constructor) finds it here. */
#define REAL(name)                                                                       \
    if (real_##name == NULL)                                                             \
        RESOLVE(name)

/* A wrapper: count, delay on entry, call libc, delay on exit (errno kept). */
#define PERTURBED(syscall_name, name, call)                                              \
    REAL(name);                                                                          \
    long enter, exit_;                                                                   \
    if (n_rules == 0)                                                                    \
        return call;                                                                     \
    decide(syscall_name, &enter, &exit_);                                                \
    if (enter)                                                                           \
        sleep_us(enter);                                                                 \
    __typeof__(call) ret = call;                                                         \
    if (exit_) {                                                                         \
        int saved = errno;                                                               \
        sleep_us(exit_);                                                                 \
        errno = saved;                                                                   \
    }                                                                                    \
    return ret;

int poll(struct pollfd *fds, nfds_t n, int timeout) { PERTURBED("poll", poll, real_poll(fds, n, timeout)) }
int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *t, const sigset_t *m) { PERTURBED("ppoll", ppoll, real_ppoll(fds, n, t, m)) }
int accept(int fd, struct sockaddr *a, socklen_t *l) { PERTURBED("accept", accept, real_accept(fd, a, l)) }
int accept4(int fd, struct sockaddr *a, socklen_t *l, int f) { PERTURBED("accept4", accept4, real_accept4(fd, a, l, f)) }
int connect(int fd, const struct sockaddr *a, socklen_t l) { PERTURBED("connect", connect, real_connect(fd, a, l)) }
ssize_t recv(int fd, void *b, size_t n, int f) { PERTURBED("recvfrom", recv, real_recv(fd, b, n, f)) }
ssize_t recvfrom(int fd, void *b, size_t n, int f, struct sockaddr *a, socklen_t *l) { PERTURBED("recvfrom", recvfrom, real_recvfrom(fd, b, n, f, a, l)) }
ssize_t recvmsg(int fd, struct msghdr *m, int f) { PERTURBED("recvmsg", recvmsg, real_recvmsg(fd, m, f)) }
ssize_t send(int fd, const void *b, size_t n, int f) { PERTURBED("sendto", send, real_send(fd, b, n, f)) }
ssize_t sendto(int fd, const void *b, size_t n, int f, const struct sockaddr *a, socklen_t l) { PERTURBED("sendto", sendto, real_sendto(fd, b, n, f, a, l)) }
ssize_t sendmsg(int fd, const struct msghdr *m, int f) { PERTURBED("sendmsg", sendmsg, real_sendmsg(fd, m, f)) }
ssize_t read(int fd, void *b, size_t n) { PERTURBED("read", read, real_read(fd, b, n)) }
ssize_t write(int fd, const void *b, size_t n) { PERTURBED("write", write, real_write(fd, b, n)) }
ssize_t readv(int fd, const struct iovec *v, int n) { PERTURBED("readv", readv, real_readv(fd, v, n)) }
ssize_t writev(int fd, const struct iovec *v, int n) { PERTURBED("writev", writev, real_writev(fd, v, n)) }
int close(int fd) { PERTURBED("close", close, real_close(fd)) }
int shutdown(int fd, int how) { PERTURBED("shutdown", shutdown, real_shutdown(fd, how)) }
int epoll_wait(int e, struct epoll_event *v, int n, int t) { PERTURBED("epoll_wait", epoll_wait, real_epoll_wait(e, v, n, t)) }
int epoll_pwait(int e, struct epoll_event *v, int n, int t, const sigset_t *m) { PERTURBED("epoll_pwait", epoll_pwait, real_epoll_pwait(e, v, n, t, m)) }
