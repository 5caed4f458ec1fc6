// The lifecycle audit's kernel side: the syscalls of one process tree, as events in a ring
// buffer, without stopping a thread. The user side (orchestration/ebpf) decides which
// syscalls count and what memory each one's event carries, and renders the events as the
// strace lines the checker reads.
//
// Built by build.rs with `clang -target bpf`; it needs no kernel headers: tracepoint layouts
// are either fixed ABI (raw_syscalls) or read from tracefs by the user side (sched).

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef long long __s64;
typedef int __s32;

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

enum { BPF_MAP_TYPE_HASH = 1, BPF_MAP_TYPE_ARRAY = 2, BPF_MAP_TYPE_RINGBUF = 27 };
enum { BPF_ANY = 0 };
enum { BPF_RB_NO_WAKEUP = 1, BPF_RB_FORCE_WAKEUP = 2, BPF_RB_AVAIL_DATA = 0 };

// The reader is woken only once this much is waiting (it also drains every few ms): a wakeup
// per event would cost the traced program a context switch per syscall.
#define WAKE_AT (256 << 10)

// Helper numbers are the kernel's stable ABI (include/uapi/linux/bpf.h).
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static __u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;
static long (*bpf_probe_read_user)(void *dst, __u32 size, const void *src) = (void *)112;
static long (*bpf_probe_read_user_str)(void *dst, __u32 size, const void *src) = (void *)114;
static void *(*bpf_ringbuf_reserve)(void *ringbuf, __u64 size, __u64 flags) = (void *)131;
static __u64 (*bpf_ringbuf_query)(void *ringbuf, __u64 flags) = (void *)134;
static void (*bpf_ringbuf_submit)(void *data, __u64 flags) = (void *)132;
static long (*bpf_probe_read_kernel)(void *dst, __u32 size, const void *src) = (void *)113;

#define CAPTURE 128
#define SYSCALLS 512

enum kind { ENTER = 0, EXIT = 1, THREAD_EXIT = 2, URING_OP = 3, URING_DONE = 4 };
enum when { NEVER = 0, AT_ENTER = 1, AT_EXIT = 2 };

// What one syscall's event carries besides its arguments: up to two reads of user memory,
// each from a pointer argument, at entry or at return.
struct capture {
    __u8 when[2];
    __u8 arg[2];
    // Bytes to read; when len_arg < 6, at most args[len_arg] * len_mul of them.
    __u16 len[2];
    __u8 len_arg[2];
    __u8 len_mul[2];
    // Read a NUL-terminated string rather than bytes.
    __u8 string[2];
    __u8 wanted;
    __u8 pad;
};

struct event {
    __u64 ts;
    __u32 tid;
    __u32 tgid;
    __u32 kind;
    __s32 id;
    __u64 args[6];
    __s64 ret;
    __u32 cap_len[2];
    __u8 cap[2][CAPTURE];
};

// Processes whose syscalls are recorded (tgid -> 1), and the tracer's own (tgid -> 2): its
// children join the first set when they are forked, and it is not recorded itself.
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, __u8);
} traced SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, SYSCALLS);
    __type(key, __u32);
    __type(value, struct capture);
} captures SEC(".maps");

// A thread's arguments at entry, kept until return for the reads made then (pipe2's fds).
struct args {
    __u64 v[6];
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, struct args);
} entered SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 16 << 20);
} events SEC(".maps");

// [0]: events dropped because the ring buffer was full; [1]: user reads that failed.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, __u64);
} lost SEC(".maps");

// A thread that spins on a non-blocking call: the same syscall on the same descriptor failing
// with EAGAIN again and again (a polling receive loop) would fill the ring on two cores. Such
// a repeat is folded: neither its entry nor its exit is recorded, and the next call that ends
// otherwise is recorded whole (entry and exit, both at its return). The checker loses nothing
// it judges by: the first such call is recorded, and so is the one that ends the spin.
#define EAGAIN 11
struct spin {
    __s32 id;
    __u32 again;    // the thread's last call failed with EAGAIN
    __u64 fd;       // its first argument
    __u32 skipping; // the call in progress is a folded repeat
    __u32 pad;
    __u64 folded;   // repeats folded so far
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, struct spin);
} spinning SEC(".maps");

// Where sched_process_fork keeps the child's pid on this kernel (from its tracefs format file).
volatile const __u32 fork_child_pid = 44;

// io_uring requests a traced process submitted, until they complete: req -> who and what. An
// operation in flight on a descriptor is a use of it that no syscall shows (the submitting
// call returned long ago), so a close then is a close while in use.
struct uring_req {
    __u64 pid_tgid;
    __u64 opcode;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u64);
    __type(value, struct uring_req);
} uring SEC(".maps");

// Where the io_uring tracepoints keep their fields on this kernel (from tracefs).
volatile const __u32 uring_submit_req = 16;
volatile const __u32 uring_submit_opcode = 32;
volatile const __u32 uring_file_req = 16;
volatile const __u32 uring_file_fd = 32;
volatile const __u32 uring_done_req = 16;
volatile const __u32 uring_done_res = 32;

static void count_lost(__u32 which) {
    __u64 *n = bpf_map_lookup_elem(&lost, &which);
    if (n)
        __sync_fetch_and_add(n, 1);
}

static int recorded(__u32 tgid) {
    __u8 *t = bpf_map_lookup_elem(&traced, &tgid);
    return t && *t == 1;
}

static void read_capture(struct event *e, struct capture *c, int i, __u8 when) {
    if (c->when[i] != when)
        return;
    __u32 a = c->arg[i];
    if (a > 5)
        return;
    __u64 ptr = e->args[a];
    __u64 n = c->len[i];
    if (c->len_arg[i] < 6) {
        __u64 max = e->args[c->len_arg[i] & 7] * c->len_mul[i];
        if (max < n)
            n = max;
    }
    if (n > CAPTURE)
        n = CAPTURE;
    // Hide n's origin from clang, so that the verifier sees the bound on the register the
    // read is given (clang otherwise reuses the unbounded copy).
    asm volatile("" : "+r"(n));
    if (n == 0 || n > CAPTURE || ptr == 0)
        return;
    long r;
    if (c->string[i])
        r = bpf_probe_read_user_str(e->cap[i & 1], n, (void *)ptr);
    else
        r = bpf_probe_read_user(e->cap[i & 1], n, (void *)ptr);
    if (r < 0) {
        count_lost(1);
        return;
    }
    e->cap_len[i & 1] = c->string[i] ? (__u32)r : n;
}

struct sys_enter_ctx {
    __u64 common;
    long id;
    unsigned long args[6];
};

struct sys_exit_ctx {
    __u64 common;
    long id;
    long ret;
};

// An event for the current thread, reserved and filled in but for what entry and return add;
// NULL when the ring buffer is full (counted).
static __attribute__((always_inline)) struct event *reserve(__u64 pid_tgid, __u32 kind, __s32 id) {
    struct event *e = bpf_ringbuf_reserve(&events, sizeof(struct event), 0);
    if (!e) {
        count_lost(0);
        return 0;
    }
    e->ts = bpf_ktime_get_ns();
    e->tid = (__u32)pid_tgid;
    e->tgid = pid_tgid >> 32;
    e->kind = kind;
    e->id = id;
    e->ret = 0;
    e->cap_len[0] = 0;
    e->cap_len[1] = 0;
    for (int i = 0; i < 6; i++)
        e->args[i] = 0;
    return e;
}

// The capture entry of syscall `id` when a traced process makes it and it is recorded.
static __attribute__((always_inline)) struct capture *wanted(__u64 pid_tgid, long sysid) {
    if (!recorded(pid_tgid >> 32))
        return 0;
    __u32 id = sysid;
    if (id >= SYSCALLS)
        return 0;
    struct capture *c = bpf_map_lookup_elem(&captures, &id);
    return c && c->wanted ? c : 0;
}

static __attribute__((always_inline)) void submit(struct event *e) {
    __u64 flags = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= WAKE_AT ? BPF_RB_FORCE_WAKEUP
                                                                         : BPF_RB_NO_WAKEUP;
    bpf_ringbuf_submit(e, flags);
}

static __attribute__((always_inline)) int read_at_exit(struct capture *c) {
    return c->when[0] == AT_EXIT || c->when[1] == AT_EXIT;
}

SEC("tracepoint/raw_syscalls/sys_enter")
int on_enter(struct sys_enter_ctx *ctx) {
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    struct capture *c = wanted(pid_tgid, ctx->id);
    if (!c)
        return 0;
    __u32 me = (__u32)pid_tgid;
    struct spin *sp = bpf_map_lookup_elem(&spinning, &me);
    if (!sp) {
        struct spin fresh = {0};
        fresh.id = -1;
        bpf_map_update_elem(&spinning, &me, &fresh, BPF_ANY);
        sp = bpf_map_lookup_elem(&spinning, &me);
    }
    if (sp) {
        sp->skipping = sp->again && sp->id == (__s32)ctx->id && sp->fd == ctx->args[0];
        if (!sp->skipping) {
            sp->id = (__s32)ctx->id;
            sp->fd = ctx->args[0];
            sp->again = 0;
        }
        if (sp->skipping) {
            // Kept for the exit, which records the whole call if it ends the spin.
            // One read each, at fixed offsets: the verifier refuses a context pointer moved
            // by a loop.
            struct args a = {{ctx->args[0], ctx->args[1], ctx->args[2], ctx->args[3],
                              ctx->args[4], ctx->args[5]}};
            bpf_map_update_elem(&entered, &me, &a, BPF_ANY);
            return 0;
        }
    }
    struct event *e = reserve(pid_tgid, ENTER, ctx->id);
    if (!e)
        return 0;
    for (int i = 0; i < 6; i++)
        e->args[i] = ctx->args[i];
    read_capture(e, c, 0, AT_ENTER);
    read_capture(e, c, 1, AT_ENTER);
    if (read_at_exit(c)) {
        __u32 tid = e->tid;
        struct args a;
        for (int i = 0; i < 6; i++)
            a.v[i] = e->args[i];
        bpf_map_update_elem(&entered, &tid, &a, BPF_ANY);
    }
    submit(e);
    return 0;
}

SEC("tracepoint/raw_syscalls/sys_exit")
int on_exit(struct sys_exit_ctx *ctx) {
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    struct capture *c = wanted(pid_tgid, ctx->id);
    if (!c)
        return 0;
    __u32 me = (__u32)pid_tgid;
    struct spin *sp = bpf_map_lookup_elem(&spinning, &me);
    int again = ctx->ret == -EAGAIN;
    if (sp && sp->skipping) {
        sp->skipping = 0;
        if (again) {
            sp->folded++;
            return 0;
        }
        // The spin ends: record this call's entry now, from the arguments kept at entry.
        struct args *kept = bpf_map_lookup_elem(&entered, &me);
        struct event *in = reserve(pid_tgid, ENTER, ctx->id);
        if (in) {
            if (kept)
                for (int i = 0; i < 6; i++)
                    in->args[i] = kept->v[i];
            read_capture(in, c, 0, AT_ENTER);
            read_capture(in, c, 1, AT_ENTER);
            submit(in);
        }
    }
    if (sp)
        sp->again = again;
    struct event *e = reserve(pid_tgid, EXIT, ctx->id);
    if (!e)
        return 0;
    __u32 tid = e->tid;
    e->ret = ctx->ret;
    if (read_at_exit(c)) {
        struct args *at = bpf_map_lookup_elem(&entered, &tid);
        if (at) {
            for (int i = 0; i < 6; i++)
                e->args[i] = at->v[i];
            bpf_map_delete_elem(&entered, &tid);
            if (ctx->ret >= 0) {
                read_capture(e, c, 0, AT_EXIT);
                read_capture(e, c, 1, AT_EXIT);
            }
        }
    }
    submit(e);
    return 0;
}

SEC("tracepoint/sched/sched_process_fork")
int on_fork(void *ctx) {
    __u32 child = 0;
    bpf_probe_read_kernel(&child, 4, (char *)ctx + fork_child_pid);
    // It runs in the parent: what counts is the parent's process.
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    __u8 *t = bpf_map_lookup_elem(&traced, &tgid);
    if (!t)
        return 0;
    // A new thread shares its process's entry; a new process gets its own.
    __u8 one = 1;
    __u32 key = child;
    if (bpf_map_lookup_elem(&traced, &key) == 0)
        bpf_map_update_elem(&traced, &key, &one, BPF_ANY);
    return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int on_task_exit(void *ctx) {
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    if (!recorded(pid_tgid >> 32))
        return 0;
    __u32 tid = (__u32)pid_tgid;
    bpf_map_delete_elem(&entered, &tid);
    bpf_map_delete_elem(&spinning, &tid);
    struct event *e = reserve(pid_tgid, THREAD_EXIT, -1);
    if (e)
        submit(e);
    return 0;
}

SEC("tracepoint/io_uring/io_uring_submit_req")
int on_uring_submit(void *ctx) {
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    if (!recorded(pid_tgid >> 32))
        return 0;
    __u64 req = 0;
    __u8 opcode = 0;
    bpf_probe_read_kernel(&req, 8, (char *)ctx + uring_submit_req);
    bpf_probe_read_kernel(&opcode, 1, (char *)ctx + uring_submit_opcode);
    struct uring_req r = {pid_tgid, opcode};
    bpf_map_update_elem(&uring, &req, &r, BPF_ANY);
    return 0;
}

// The request takes its descriptor (not for registered files): it is in flight on it from now.
SEC("tracepoint/io_uring/io_uring_file_get")
int on_uring_file(void *ctx) {
    __u64 req = 0;
    __s32 fd = -1;
    bpf_probe_read_kernel(&req, 8, (char *)ctx + uring_file_req);
    struct uring_req *r = bpf_map_lookup_elem(&uring, &req);
    if (!r)
        return 0;
    bpf_probe_read_kernel(&fd, 4, (char *)ctx + uring_file_fd);
    struct event *e = reserve(r->pid_tgid, URING_OP, -1);
    if (!e)
        return 0;
    e->args[0] = req;
    e->args[1] = (__u64)(__s64)fd;
    e->args[2] = r->opcode;
    submit(e);
    return 0;
}

// Its completion, in whatever context it runs (a worker, task work): told as its submitter's.
SEC("tracepoint/io_uring/io_uring_complete")
int on_uring_done(void *ctx) {
    __u64 req = 0;
    __s32 res = 0;
    bpf_probe_read_kernel(&req, 8, (char *)ctx + uring_done_req);
    struct uring_req *r = bpf_map_lookup_elem(&uring, &req);
    if (!r)
        return 0;
    bpf_probe_read_kernel(&res, 4, (char *)ctx + uring_done_res);
    struct event *e = reserve(r->pid_tgid, URING_DONE, -1);
    if (e) {
        e->args[0] = req;
        e->ret = res;
        submit(e);
    }
    bpf_map_delete_elem(&uring, &req);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
